#!/usr/bin/env bash
# Prints the directory of llama.cpp's source as vendored in the PyPI sdist of llama-cpp-python
# (its tokenizer test data, templates, converter and gguf-py), downloading it once into
# ${SAPIENT_LLAMA_CPP_CACHE:-~/.cache/sapient/llama.cpp}.
set -euo pipefail
version=0.3.36
cache="${SAPIENT_LLAMA_CPP_CACHE:-$HOME/.cache/sapient/llama.cpp}"
src="$cache/src-$version"
if [ ! -f "$src/models/ggml-vocab-llama-spm.gguf.out" ]; then
    echo "downloading llama.cpp (llama-cpp-python $version sdist) into $src" >&2
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # Without build isolation, pip reads the sdist's metadata with the installed scikit-build-core
    # instead of building a CMake from source first.
    # scikit-build-core wants a CMake to read the metadata; the `cmake` wheel brings one.
    python3 -m pip install --quiet scikit-build-core cmake >&2
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python --no-build-isolation \
        --dest "$tmp" "llama-cpp-python==$version" >&2
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    rm -rf "$src"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$src"
fi
echo "$src"
