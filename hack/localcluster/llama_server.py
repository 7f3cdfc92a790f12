"""A real model server for the e2e suite: llama.cpp's ``llama-server``, the server llama-swap users run,
built from source into an image for the real node (docs/development.md#a-real-model-server).

The source is the llama-cpp-python sdist from PyPI, which vendors llama.cpp (its ``tools/server``, and the
vocabulary-only GGUFs the tests build tiny models on). It is built CPU-only with cmake, statically (no
OpenMP, libstdc++ linked in), so that the binary runs on the Python base image with nothing added. The
binary and a vocabulary are cached by the sdist's version and the build's options; a build takes about
6.5 minutes on 2 cores, once per machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .errors import ClusterError, Log
from .images import Image, _digest, _layer_from_dir, build_base, cache_dir, write_archive

SDIST = "llama-cpp-python"
SDIST_VERSION = "0.3.36"  # vendors llama.cpp 0.5.0-dev (0c1e570)
IMAGE = f"gpulane.local/llama-server:{SDIST_VERSION}"
VOCAB = "ggml-vocab-llama-spm.gguf"  # 32,000 tokens: the tiny models' vocabulary
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # ggml still compiles for AVX2, FMA, F16C and BMI2: any recent x86-64
    "-DGGML_OPENMP=OFF",  # ggml's own thread pool: no libgomp in the image
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    # The web UI is not built, nor downloaded (that would wait on the network at every configure).
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc",
)
BUILD_TOOLS = ("cmake", "make", "g++")
RECIPE = "1"


def _key() -> str:
    return _digest(RECIPE, SDIST, SDIST_VERSION, *CMAKE_OPTIONS)[:16]


def built_dir() -> Path:
    """Where the binary and the vocabulary are kept (``llama-server``, ``VOCAB``)."""
    return cache_dir() / f"llama-server-{_key()}"


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"{what} failed ({' '.join(argv[:3])} ...):\n{(proc.stdout + proc.stderr)[-3000:]}")


def _source(work: Path, log: Log) -> Path:
    """The sdist's vendored llama.cpp, unpacked under ``work``."""
    downloads = cache_dir() / "downloads"
    sdist = downloads / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not sdist.exists():
        log(f"downloading the {SDIST} {SDIST_VERSION} sdist from PyPI (76 MB: llama.cpp's source)")
        downloads.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              "--dest", str(downloads), f"{SDIST}=={SDIST_VERSION}"], f"pip download {SDIST}")  # fmt: skip
        if not sdist.exists():
            raise ClusterError(f"pip download did not write {sdist}")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    source = work / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"
    if not (source / "tools" / "server").is_dir():
        raise ClusterError(f"{sdist} has no vendor/llama.cpp/tools/server")
    return source


def build_binary(log: Log) -> Path:
    """``llama-server`` and the vocabulary in ``built_dir()``, built if they are not there yet."""
    out = built_dir()
    if (out / "llama-server").exists() and (out / VOCAB).exists():
        return out
    missing = [tool for tool in BUILD_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"building llama-server needs {', '.join(missing)}: run `make node-deps` "
                           "(installs cmake, make and g++ from Debian's packages)")  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-server-") as tmp:
        source = _source(Path(tmp), log)
        build = Path(tmp) / "build"
        log(f"building llama-server from {SDIST} {SDIST_VERSION} (cmake, CPU only; about 6.5 min on 2 cores)")
        _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS], "cmake configure")
        jobs = str(os.cpu_count() or 2)
        _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], "cmake build")
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shutil.copy2(build / "bin" / "llama-server", partial / "llama-server")
        _run(["strip", str(partial / "llama-server")], "strip")
        shutil.copy2(source / "models" / VOCAB, partial / VOCAB)
        shutil.rmtree(out, ignore_errors=True)
        partial.replace(out)
    log(f"llama-server built in {time.monotonic() - started:.0f}s ({out})")
    return out


def build_image(log: Log) -> Image:
    """The image: the Python base's root filesystem and ``/usr/local/bin/llama-server`` on it."""
    binary = build_binary(log) / "llama-server"
    base, base_layer = build_base(log)
    key = _digest(_key(), base.key)[:16]
    archive = cache_dir() / f"llama-server-{key}.tar"
    if archive.exists():
        return Image(IMAGE, archive, key)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "usr" / "local" / "bin").mkdir(parents=True)
        shutil.copy2(binary, root / "usr" / "local" / "bin" / "llama-server")
        layer = Path(tmp) / "layer.tar"
        _layer_from_dir(root, layer)
        settings = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                    "Entrypoint": ["/usr/local/bin/llama-server"]}  # fmt: skip
        write_archive(archive, (IMAGE,), [base_layer, layer], settings)
    return Image(IMAGE, archive, key)
