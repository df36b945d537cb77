import sys

from inferno.cli import main

sys.exit(main())
