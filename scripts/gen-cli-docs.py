#!/usr/bin/env python3
"""Write docs/cli.md from the `ledgerstore` parser (ledgerstore/cli_docs.py). Run after changing any flag."""

import sys

from ledgerstore.cli_docs import main

if __name__ == "__main__":
    sys.exit(main())
