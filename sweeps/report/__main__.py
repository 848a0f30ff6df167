import sys

from sweeps.report import main

sys.exit(main())
