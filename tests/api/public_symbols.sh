#!/bin/sh
# The public archive exports the API of include/tern.h and nothing else:
# fails on any defined global symbol without the tern_ prefix, on a tern_
# symbol the header does not declare, and on a declared function missing.
#   public_symbols.sh [LIBTERN_A]
set -eu
LIB=${1:-${TERN_BUILD:-build}/libtern.a}
HDR=${TERN_ROOT:-.}/include/tern.h
[ -f "$LIB" ] || { echo "no $LIB"; exit 1; }
syms=$(nm -g --defined-only "$LIB" | awk 'NF == 3 { print $3 }' | sort -u)
[ -n "$syms" ] || { echo "no symbols exported by $LIB"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^tern_' || true)
if [ -n "$bad" ]; then
    echo "exported without the tern_ prefix ($(printf '%s\n' "$bad" | wc -l)):"
    printf '%s\n' "$bad" | head -50
    exit 1
fi
# functions the header declares (comments stripped)
decl=$(sed 's@/\*.*\*/@@g; /\/\*/,/\*\//d' "$HDR" | grep -o 'tern_[A-Za-z0-9_]*[[:space:]]*(' | tr -d ' (' | sort -u)
extra=$(printf '%s\n' "$syms" | grep -vxF "$decl" || true)
if [ -n "$extra" ]; then
    echo "exported but not declared in include/tern.h:"
    printf '%s\n' "$extra"
    exit 1
fi
missing=$(printf '%s\n' "$decl" | grep -vxF "$syms" || true)
if [ -n "$missing" ]; then
    echo "declared in include/tern.h but not defined in $LIB:"
    printf '%s\n' "$missing"
    exit 1
fi
echo "$LIB exports $(printf '%s\n' "$syms" | wc -l) symbols, all declared in include/tern.h:"
printf '  %s\n' $syms
