# gpulane's image: the operator, the admission webhook and the bridge (`gpulane operator|webhook|bridge`).
#
#   docker build -t gpulane .                                   # on the public Python base (BASE below)
#   make images                                                 # here: no Docker engine, no registry
#
# `make images` assembles this same file on a local Debian base (gpulane.local/python-base:bookworm,
# python3 3.11 from Debian's packages): hack/localcluster/images.py applies ENV, WORKDIR, COPY, USER and
# ENTRYPOINT as Docker does and runs the RUN line's pip command on the host's Python 3.11 into the image.
# It refuses any other instruction, so keep this file to those.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# USER: the runtime uid 65532 has no passwd entry, and kopf's peering id calls getpass.getuser().
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/opt/gpulane/lib USER=gpulane
WORKDIR /opt/gpulane/src
COPY pyproject.toml README.md requirements.lock ./
COPY gpulane/ ./gpulane/
# --target: a plain directory on PYTHONPATH, the same on both bases (Debian's python3 and the official
# image keep site-packages in different places). -c: the versions requirements.lock pins (`make lock`).
RUN python3 -m pip install --no-cache-dir --target=/opt/gpulane/lib -c requirements.lock .
WORKDIR /opt/gpulane
USER 65532:65532
ENTRYPOINT ["python3", "/opt/gpulane/lib/bin/gpulane"]
