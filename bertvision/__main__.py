import sys

from bertvision.cli import main

sys.exit(main())
