#!/usr/bin/env bash
# Builds the GPU tests and benchmark on a development machine (one with nvcc and the Debian build
# packages) into one folder that can be copied to a GPU machine and run there by gpu-check.sh:
# sm_90 code (H100, H200), everything linked statically except the CUDA driver (cudart, libstdc++,
# libgcc and fmt included), so the GPU machine needs no packages. kvd-llama comes too, for the
# end-to-end check, with the module it loads for --device cuda (kvd-llama-cuda.so): the module
# also needs cuBLAS (libcublas.so.13, over 500 MB with cuBLASLt, so it is not copied), which
# gpu-check.sh looks for on the GPU machine.
#
#   scripts/gpu-build.sh [OUT_DIR]      (default: build-gpu/pack)
#   KVD_GPU_ARCH=80 scripts/gpu-build.sh   another architecture
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KVD_GPU_BUILD:-build-gpu}
out=${1:-$build/pack}
arch=${KVD_GPU_ARCH:-90}
targets=(test_dense_decode test_page_scores test_sparse_decode test_top_k test_page_gather test_hierarchical test_device_manager bench_gpu kvd-llama kvd-llama-cuda)

bash scripts/bootstrap
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVD_CUDA=ON -DKVD_PORTABLE=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DKVD_BUILD_EXAMPLES=ON -DKVD_BUILD_TESTS=ON -DKVD_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$out"
for t in "${targets[@]}"; do
  file=$t; [ "$t" = kvd-llama-cuda ] && file=kvd-llama-cuda.so  # the module beside kvd-llama
  path=$(find "$build/tests" "$build/bench" "$build/examples" -type f -name "$file" -perm -u+x | head -n 1)  # not the pack of an earlier run
  [ -n "$path" ] || { echo "gpu-build: $t was not built" >&2; exit 1; }
  cp "$path" "$out/"
  # Only the C library, the driver (libcuda, loaded at run time) and the module's cuBLAS may stay
  # dynamic: the binary's own NEEDED entries, not those of cuBLAS (ldd would list both).
  needed=$(readelf -d "$out/$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  other=$(echo "$needed" | grep -v -E '^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64)\.so|^libcuda\.so' |
          { [ "$t" = kvd-llama-cuda ] && grep -v -E '^libcublas(Lt)?\.so' || cat; } || true)
  if [ -n "$other" ]; then
    echo "gpu-build: $t still links a library the GPU machine may lack: $(echo $other)" >&2
    exit 1
  fi
done
cp scripts/gpu-check.sh "$out/"
echo "gpu-build: $out holds ${targets[*]} and gpu-check.sh (sm_$arch); copy it over and run ./gpu-check.sh there"
