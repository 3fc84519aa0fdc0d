"""`python -m impala_cli.reference docs/reference`: rewrite the reference pages."""

import sys

from impala_cli.reference import main

sys.exit(main())
