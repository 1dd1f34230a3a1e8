"""Errors the user can fix: each names the file and line, config key or setting at fault. The
command line prints them as one line each, without a traceback, and exits with status 2."""


class BertvisionError(Exception):
    pass


class ConfigError(BertvisionError, ValueError):
    """A config file or key is invalid (names the file and the key path)."""


class SettingsError(BertvisionError, ValueError):
    """A stage's settings (its --settings JSON) are incomplete or of the wrong type."""


class DataFormatError(BertvisionError, ValueError):
    """A data file does not parse (names the file and line, or the hub split and row)."""


class FeatureError(BertvisionError, RuntimeError):
    """A feature shard or manifest is missing, truncated, modified or of the wrong kind."""


class DeviceError(BertvisionError, RuntimeError):
    """A device the config or a flag asks for is not on this machine."""


class MissingError(BertvisionError, FileNotFoundError):
    """A file, folder or package the config names is not there (a data file, a backbone)."""


class CacheError(BertvisionError, OSError):
    """A cache folder that must hold what a job builds cannot be written."""


class DiskSpaceError(BertvisionError, OSError):
    """The disk has less room than a job's outputs need."""


class DiskFullError(DiskSpaceError):
    """The disk filled up while a job wrote to it. HDF5 can neither close nor free a file whose
    write found no room (h5py issue 914), so the command line ends the process at once, without
    finalizing it (``features.shard_writer.UNCLOSABLE``)."""
