# Sourced by the hack/ensure-*.sh scripts that take a tool from a Debian package.
#
# apt_ensure COMMAND PACKAGE: prints COMMAND's path; when it is not on PATH, first installs
# Debian's PACKAGE (as root, or through sudo) and sets APT_INSTALLED=1. Exits non-zero with a
# message when it cannot install. APT_SUDO holds the sudo prefix used (empty as root).
APT_INSTALLED=0
APT_SUDO=()

apt_ensure() {
  local command=$1 package=$2 path
  if path=$(command -v "$command"); then
    echo "$path"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "$command is missing and installing it needs root or sudo" >&2; exit 1; }
    APT_SUDO=(sudo)
  fi
  echo "$command not found: installing Debian's $package package" >&2
  "${APT_SUDO[@]}" apt-get update -qq >&2
  "${APT_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >&2
  APT_INSTALLED=1
  command -v "$command"
}
