# Sourced by scripts/check-libtorch2.sh and scripts/gpu-smoke.sh: Debian packages of
# another release (or source packages) fetched with apt's own client into a private
# state directory — its own sources list, package lists and cache — so nothing of the
# machine's apt state changes and nothing is installed. Packages are only downloaded
# (apt-get download / apt-get source --download-only) and unpacked with dpkg -x.
#
#   apt_private_setup DIR "deb|deb-src|deb deb-src" SUITE COMPONENT...   # sets APT_PRIVATE
#   apt_private_download DESTDIR PACKAGE...                  # .deb files into DESTDIR
#
# The mirror is the one this machine's apt already uses for Debian (EDIT_DEBIAN_MIRROR
# overrides it). Both functions return non-zero (never exit) when apt cannot reach it.

APT_PRIVATE=()

apt_private_mirror() {
  if [ -n "${EDIT_DEBIAN_MIRROR:-}" ]; then echo "$EDIT_DEBIAN_MIRROR"; return 0; fi
  local codename
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  # The Debian archive this machine installs its release from (not -security/-updates).
  apt-get indextargets --format '$(ORIGIN) $(CODENAME) $(REPO_URI)' 'Created-By: Packages' 2>/dev/null |
    awk -v c="$codename" '$1 == "Debian" && $2 == c { print $3; exit }' | grep . || return 1
}

apt_private_setup() {
  local dir=$1 type=$2 suite=$3; shift 3
  local mirror
  mirror=$(apt_private_mirror) || { echo "apt-private: no Debian mirror configured (set EDIT_DEBIAN_MIRROR)" >&2; return 1; }
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/parts"
  local t
  for t in $type; do
    echo "$t [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite $*"
  done > "$dir/sources.list"
  # Only this list, no preferences or pins of the machine's, and no translations.
  APT_PRIVATE=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=$dir/parts"
    -o "Dir::Etc::Preferences=$dir/parts/none" -o "Dir::Etc::PreferencesParts=$dir/parts"
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o "Acquire::Languages=none"
    -o "APT::Sandbox::User=$(id -un)")
  # Lists younger than a day are reused (the check runs on every CI run).
  if [ -n "$(find "$dir/lists" -maxdepth 1 -name '*Release' -mmin -1440 2>/dev/null)" ] &&
     [ "$(cat "$dir/sources.used" 2>/dev/null)" = "$(cat "$dir/sources.list")" ]; then
    return 0
  fi
  if ! apt-get "${APT_PRIVATE[@]}" -q update > "$dir/update.log" 2>&1 ||
     grep -qE '^(W|E): (Failed|Some index files failed)' "$dir/update.log"; then
    sed 's/^/apt-private: /' "$dir/update.log" >&2
    return 1
  fi
  cp "$dir/sources.list" "$dir/sources.used"
}

apt_private_download() {
  local dest=$1; shift
  mkdir -p "$dest"
  (cd "$dest" && apt-get "${APT_PRIVATE[@]}" -q download "$@") > "$dest/download.log" 2>&1 ||
    { sed 's/^/apt-private: /' "$dest/download.log" >&2; return 1; }
}
