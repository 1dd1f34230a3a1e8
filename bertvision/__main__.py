import sys

from bertvision.commands.main import main

sys.exit(main())
