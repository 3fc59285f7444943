#!/usr/bin/env bash
# The offline install for a GPU machine with no network (the lent H200s: CPython 3.12, torch 2.11.0+cu130):
# vLLM 0.26.0 (the release built for torch 2.11 + CUDA 13), TRL 1.16.0, PEFT 0.21.2, datasets, and what they
# import that the machine's image lacks, pinned in scripts/gpu-wheels.txt.
#
#   bash scripts/gpu_wheels.sh [OUT]       # OUT (default .gpu-stage/wheels) gets site.tar.xz.part-NN-of-MM
#   bash scripts/gpu_wheels.sh --resolve   # re-pin scripts/gpu-wheels.txt (needs uv: pip install uv)
#
# Downloads the wheels, installs them into one folder without resolving anything (pip --target --no-deps, for
# Python 3.12 whatever Python runs this), prunes what a dense bf16 model on a Hopper GPU never loads, packs the
# folder as tar.xz and splits it into parts of at most 58 MiB: a device call carries 64 MiB, so each part travels
# in a call of its own and scripts/gpu_bench.sh joins them on the machine. Takes ~10 minutes on two cores, most
# of it xz.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PINS=scripts/gpu-wheels.txt
# A device call carries 64 MiB with the working tree (4.5 MiB tracked now): a 60 MiB part no longer fits beside it;
# 58 does (62.5), and packs the xz -1 set (113.5 MiB) in two parts.
PART_MIB=58
XZ_LEVEL=${XZ_LEVEL:-6}     # 1 packs several times faster into a larger set (113.5 MiB): for a loaded machine
PLATFORMS=(--platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64
           --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}")
# What a dense model on Hopper never loads, ~520 MB of vLLM's 730: FlashAttention 2 (Hopper runs FA3), the MoE
# kernels (imported in a try), the Rust front end (off by default), Blackwell attention and DeepGEMM (FP8 blocks).
PRUNE=(vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs
       vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm bin)
# --resolve: GPU kernel packages vLLM 0.26 lists but a dense bf16 model never imports (each several hundred MB),
# and xgrammar 0.2.7, the last release that runs with the apache-tvm-ffi 0.1.10 vLLM pins.
RESOLVE_OVERRIDES="flashinfer-python; sys_platform == 'never'
tilelang; sys_platform == 'never'
nvidia-cutlass-dsl; sys_platform == 'never'
quack-kernels; sys_platform == 'never'
tokenspeed-mla; sys_platform == 'never'
humming-kernels; sys_platform == 'never'
pynvvideocodec; sys_platform == 'never'
torchcodec; sys_platform == 'never'
nvidia-cudnn-frontend; sys_platform == 'never'
fastsafetensors; sys_platform == 'never'
xgrammar==0.2.7
torch==2.11.0
torchvision==0.26.0
torchaudio==2.11.0
transformers==5.17.0
huggingface-hub==1.33.0"

resolve() {
  local tmp; tmp=$(mktemp -d)
  printf 'vllm==0.26.0\ntrl==1.16.0\npeft==0.21.2\ndatasets==4.7.0\n' >"$tmp/roots.txt"
  echo "$RESOLVE_OVERRIDES" >"$tmp/overrides.txt"
  # The image's packages are not carried, except PEFT: its version there is not known, and the trainer wants 0.21.2.
  mapfile -t skip < <(grep -v '^#' scripts/gpu-image-packages.txt | grep -vx peft | sed 's/^/--no-emit-package=/')
  uv pip compile "$tmp/roots.txt" --override "$tmp/overrides.txt" --python-version 3.12 \
    --python-platform x86_64-manylinux_2_39 --only-binary :all: --no-header --no-annotate "${skip[@]}" -o "$tmp/pins.txt"
  { sed -n '1,/^[a-z]/p' "$PINS" | grep '^#'; cat "$tmp/pins.txt"; } >"$tmp/new.txt"
  mv "$tmp/new.txt" "$PINS"
  rm -rf "$tmp"
  echo "re-pinned $PINS ($(grep -vc '^#' "$PINS") packages)"
}

if [[ "${1:-}" == "--resolve" ]]; then resolve; exit; fi
OUT=${1:-.gpu-stage/wheels}
mkdir -p "$OUT/download"
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$OUT/download" -r "$PINS"
rm -rf "$OUT/site"
"$PY" -m pip install -q --no-deps --no-compile "${TARGET[@]}" --target "$OUT/site" "$OUT"/download/*.whl
for path in "${PRUNE[@]}"; do rm -rf "${OUT:?}/site/$path"; done
find "$OUT/site" -name __pycache__ -prune -exec rm -rf {} +
echo "site: $(du -sm "$OUT/site" | cut -f1) MiB from $(ls "$OUT"/download/*.whl | wc -l) wheels"
rm -f "$OUT"/site.tar.xz*
tar -C "$OUT" -cf - site | xz -T0 "-$XZ_LEVEL" >"$OUT/site.tar.xz"
split -b "${PART_MIB}m" -d -a 2 "$OUT/site.tar.xz" "$OUT/site.tar.xz.part-"
parts=("$OUT"/site.tar.xz.part-*)
for p in "${parts[@]}"; do mv "$p" "$p-of-$(printf %02d ${#parts[@]})"; done
(cd "$OUT" && sha256sum site.tar.xz >site.tar.xz.sha256)
rm "$OUT/site.tar.xz"
ls -l "$OUT"/site.tar.xz.*
