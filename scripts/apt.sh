# scripts/apt.sh — sourced by services.sh and tools.sh: installing Debian
# packages the one way both do it. The sourcing script defines say and die.

export DEBIAN_FRONTEND=noninteractive

is_root() { [[ "$(id -u)" == 0 ]]; }

APT_UPDATED=0
# apt_install PKG... installs Debian packages when we are root, otherwise
# prints the command to run and exits.
apt_install() {
	if ! is_root; then
		die "missing $*: install with: sudo apt-get update && sudo apt-get install -y $*"
	fi
	command -v apt-get >/dev/null 2>&1 || die "missing $* and apt-get is not available: install $* with your package manager"
	if [[ "$APT_UPDATED" == 0 ]]; then
		apt-get update -qq >/dev/null
		APT_UPDATED=1
	fi
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
	say "packages: installed $*"
}
