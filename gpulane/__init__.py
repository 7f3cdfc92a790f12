"""gpulane: schedules jobs on a one-job-at-a-time GPU."""

# The one version: the package's (pyproject.toml reads it), the chart's appVersion (a test compares them),
# and so the image tag the chart defaults to.
__version__ = "0.1.0"
