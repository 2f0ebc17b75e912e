#!/usr/bin/env bash
# Run HERE, on the machine with the internet, from anywhere: puts into <repo>/.whl/ (ignored by git) the wheels that
# scripts/gpu_run.sh installs on the bare GPU machine (Python 3.12, x86-64; torch, accelerate, safetensors, numpy,
# triton, huggingface_hub, tokenizers, typer, psutil, ninja, msgpack, py-cpuinfo, einops, nvidia-ml-py are there).
# Then call the device tool with carry [".whl"] and the command `bash scripts/gpu_run.sh`.
#
#   transformers 5.24.0 (+ regex)       the version this project tests against (the image holds 5.17.0)
#   deepspeed 0.19.8 (+ hjson, pydantic, pydantic-core, annotated-types, typing-inspection)
#                                       PyPI has only its source: built here as a pure-Python wheel with no ops
#                                       compiled (DS_BUILD_OPS=0); DeepSpeed JIT-builds an op there if a check needs one
#   liger-kernel 0.8.5                  pure Python + Triton (for the Liger check, once cadence builds use_liger_kernel)
#
# About 20 MB together, well inside the device tool's 64 MiB for the working tree and carried paths.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl transformers==5.24.0 regex==2026.11.19 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 liger-kernel==0.8.5
if ! ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    # setup.py imports torch (any build, a CPU one too): build with this python's torch, no isolation
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
fi
ls -l .whl
du -sh .whl
