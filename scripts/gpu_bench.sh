#!/usr/bin/env bash
# Run benchmarks/gpu_recipes.py on a GPU machine with no network, from the parts scripts/gpu_wheels.sh made.
#
#   bash scripts/gpu_bench.sh PARTS_DIR [gpu_recipes.py arguments]
#   BENCH=benchmarks/proxy_overhead.py bash scripts/gpu_bench.sh PARTS_DIR --gpus 0 1 ...   # another benchmark
#
# PARTS_DIR holds some or all of site.tar.xz.part-NN-of-MM and site.tar.xz.sha256 (a device call carries one
# 58 MiB part). Parts are kept in /tmp/gpu-site-parts, which lasts as long as the machine; with fewer than MM
# there, this stores what came, prints the machine's GPUs and package versions, and exits. Once all are there it
# checks and unpacks them into /tmp/gpu-site (once), puts that first on the Python path and runs the benchmark; a
# later call on the same machine needs no parts at all (give a PARTS_DIR that does not exist, e.g. -).
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=${GPU_SITE_PARTS:-/tmp/gpu-site-parts}
SITE=${GPU_SITE:-/tmp/gpu-site}

versions() {
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader || true
  python3 -c '
import importlib
for name in ("torch", "vllm", "trl", "transformers", "peft", "accelerate", "datasets", "pyarrow", "fsspec"):
    try:
        print(name, importlib.import_module(name).__version__, end="; ")
    except Exception as exc:
        print(name, "FAILED", type(exc).__name__, exc, end="; ")
print()'
}

mkdir -p "$PARTS"
if [[ -d "${1:-}" ]]; then
  cp -n "$1"/site.tar.xz.* "$PARTS"/ 2>/dev/null || true
fi
shift || true
if [[ ! -d "$SITE/site" ]]; then
  shopt -s nullglob
  have=("$PARTS"/site.tar.xz.part-*)
  want=$( (ls "$PARTS"/site.tar.xz.part-* 2>/dev/null || true) | head -1 | sed 's/.*-of-//')
  if [[ -z "$want" || ${#have[@]} -lt $((10#$want)) ]]; then
    echo "have ${#have[@]} of ${want:-?} parts of the offline site in $PARTS; send the rest"
    versions
    exit 0
  fi
  # Python's own sha256 and xz: the machine needs neither tool.
  python3 -c '
import glob, hashlib, io, sys, tarfile
parts, site = sys.argv[1], sys.argv[2]
data = b"".join(open(p, "rb").read() for p in sorted(glob.glob(f"{parts}/site.tar.xz.part-*")))
if hashlib.sha256(data).hexdigest() != open(f"{parts}/site.tar.xz.sha256").read().split()[0]:
    sys.exit("the parts do not join into the site.tar.xz that was packed (sha256 differs)")
tarfile.open(fileobj=io.BytesIO(data), mode="r:xz").extractall(site)' "$PARTS" "$SITE"
fi
export PYTHONPATH="$SITE/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# FlashInfer is not carried (its sampler is vLLM's default where it is installed).
export VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off on shared machines (device docs): NCCL, PyTorch and NVSHMEM, and vLLM's
# symmetric-memory all-reduce, which would use it for tensor parallelism.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
versions
exec python3 "${BENCH:-benchmarks/gpu_recipes.py}" "$@"
