"""`make demo` (hack/gpulane_demo.py): the real system on the local cluster, playing a film against
interactive calls; see docs/demo.md."""
