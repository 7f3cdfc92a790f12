#!/usr/bin/env python3
"""`make demo`: gpulane on the local cluster's real node, a film against interactive calls (docs/demo.md).

python hack/gpulane_demo.py [--short]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hack/: localcluster and localdemo

from localdemo.cli import main

if __name__ == "__main__":
    sys.exit(main())
