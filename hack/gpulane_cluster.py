#!/usr/bin/env python3
"""gpulane's local Kubernetes cluster: the command line and the stable import name.

    python hack/gpulane_cluster.py up|down|status|env     (see `--help`, or docs/development.md)

tests/e2e and bench/ import this module as ``import gpulane_cluster as localcluster`` with hack/ on
sys.path; the code lives in the package hack/localcluster/, whose public API this module re-exports.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, hack/ is already sys.path[0]; imported, the importer put hack/ on sys.path. Either
# way, make sure the package beside this file is the one found.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster import *  # noqa: F403  (the re-export is the point)
from localcluster import main

if __name__ == "__main__":
    sys.exit(main())
