"""The command line, the top of the package: one command per workflow rule (``pipeline``,
``serving``) plus the user's own (``serve``, ``bundle``, ``validate-config``, ``clean``). Each
command declares its stage and the flags that fill the stage's parameters; nothing below this
package imports it."""
