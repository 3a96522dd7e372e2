# apt_install PKG...: installs the packages not yet installed (one apt-get
# update, only when something is missing). Sourced by setup.sh and
# test-setup.sh.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # No package starts a service on this machine (nginx, etcd, containerd
    # are only the tests' binaries): invoke-rc.d honours RUNLEVEL.
    RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: all packages present"
  fi
}
