#!/usr/bin/env bash
# Rewrites the two locks from pyproject.toml and the pins below, with uv (pip install uv):
#
#   constraints/cpu.txt   the CPU install: make setup / make test / .ci/run (torch's CPU wheel), every extra
#   constraints/cuda.txt  the GPU servers' environment (environment.yml): Linux x86_64, torch 2.13.0 from PyPI,
#                         which is its CUDA 13.0 build, with the NVIDIA wheels it names; the hub and test extras
#
#   bash constraints/lock.sh            # from the repository root; needs PyPI
#
# Both are resolved for CPython 3.11.7 on manylinux_2_28 x86_64 (soupsieve 4 needs 3.11.5 or later; a DGX and
# this course's machines are x86_64).  The CPU lock is resolved against torch 2.13.0+cpu, so it holds no NVIDIA
# wheel; its torch line is written without "+cpu" so that the same file constrains macOS laptops (whose CPU
# wheel has no local label) and the +cpu wheel alike.  The wheel itself comes from TORCH_CPU_SOURCE: PyTorch's
# CPU index by default; a folder of wheels where that is out of reach (TORCH_CPU_SOURCE="--find-links DIR").
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
TORCH_CPU_SOURCE=${TORCH_CPU_SOURCE:---extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match}
common=(--python-version 3.11.7 --python-platform x86_64-manylinux_2_28 --quiet --no-header
        --no-config --index-url https://pypi.org/simple)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The versions the tiers ran with: the browser tier with this Playwright and Debian 12's chromium 156, the
# hub tier and make hub with this JupyterHub and idle culler, benchmarks/launch_overhead.py with this accelerate.
cat > "$work/pins.txt" <<'EOF'
playwright==1.65.2
jupyterhub==6.1.1
jupyterhub-idle-culler==2.0.0
accelerate==1.16.0
EOF

echo "torch==2.13.0+cpu" > "$work/cpu-torch.txt"
# shellcheck disable=SC2086 # TORCH_CPU_SOURCE is a list of options
"$UV" pip compile pyproject.toml --extra test --extra hub --extra browser --extra slides --extra bench \
    -c "$work/pins.txt" -c "$work/cpu-torch.txt" $TORCH_CPU_SOURCE "${common[@]}" -o "$work/cpu.txt"
{
    echo "# The lock of the CPU install (make setup, make test, .ci/run; every extra), written by constraints/lock.sh:"
    echo "# do not edit by hand.  torch==2.13.0 is its CPU wheel here (2.13.0+cpu, from PyTorch's CPU index or"
    echo "# this course's local wheel); the Makefile installs it first.  GPU installs: constraints/cuda.txt."
    sed -e 's/^torch==2\.13\.0+cpu$/torch==2.13.0/' -e "s|$work/|constraints/lock.sh's |" "$work/cpu.txt"
} > constraints/cpu.txt

printf 'torch==2.13.0\nnvidia-ml-py\n' > "$work/cuda-top.txt"  # NVML: parlab.wire's NVLink byte counts
"$UV" pip compile pyproject.toml "$work/cuda-top.txt" --extra test --extra hub -c "$work/pins.txt" \
    "${common[@]}" -o "$work/cuda.txt"
{
    echo "# The lock of the GPU servers' environment (environment.yml; make test-gpu and make rehearsal on the DGX),"
    echo "# written by constraints/lock.sh: do not edit by hand.  Linux x86_64, CPython 3.11.  torch 2.13.0 from"
    echo "# PyPI is the CUDA 13.0 build (cuda-toolkit 13.0.3, NCCL 2.29.7 below): it needs an NVIDIA driver"
    echo "# of branch 580 or later (docs/jupyterhub.md, \"Locked environments\")."
    sed "s|$work/|constraints/lock.sh's |" "$work/cuda.txt"
} > constraints/cuda.txt
echo "constraints/cpu.txt: $(grep -c '^[a-z]' constraints/cpu.txt) packages; constraints/cuda.txt: $(grep -c '^[a-z]' constraints/cuda.txt) packages"
