package main

import "runtime/debug"

// Version is the build version. PAIR stamps it at build time with
// -ldflags "-X main.Version=..."; when it is not stamped, buildVersion falls
// back on what the Go toolchain recorded.
var Version string

// buildVersion is the version --version prints and ready announces: the
// stamped Version, else the module version the toolchain recorded (a tag,
// or a pseudo-version derived from the VCS revision), else the VCS revision
// itself, else "dev".
func buildVersion() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return "dev-" + rev
}
