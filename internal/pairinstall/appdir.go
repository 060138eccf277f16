package pairinstall

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
)

// PAIR keeps one data directory per user, under the vendor and product
// names. Older installations used "Personal AI Router" as the product; the
// broker migrates those before it starts any worker, so the daemon never
// looks there.
const (
	pairVendorDir  = "Nvidia Corporation"
	pairProductDir = "NVIDIA PAIR"
)

// ResolveAppDir returns the app dir as PAIR's broker implies it: the flag
// when given, else the parent of the cluster dir (the broker passes only
// --cluster-dir <appdir>/cluster), else the platform's PAIR data dir.
func ResolveAppDir(appDirFlag, clusterDirFlag string) (string, error) {
	switch {
	case appDirFlag != "":
		return appDirFlag, nil
	case clusterDirFlag != "":
		return filepath.Dir(filepath.Clean(clusterDirFlag)), nil
	}
	return defaultAppDir()
}

// defaultAppDir is <base>/Nvidia Corporation/NVIDIA PAIR, where base is
// %LOCALAPPDATA% on Windows (PAIR deliberately keeps its data out of the
// roaming profile), and what os.UserConfigDir returns elsewhere:
// $XDG_CONFIG_HOME or ~/.config on Linux, ~/Library/Application Support on
// macOS.
func defaultAppDir() (string, error) {
	base, err := appDataBase()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, pairVendorDir, pairProductDir), nil
}

func appDataBase() (string, error) {
	if runtime.GOOS == "windows" {
		if d := os.Getenv("LOCALAPPDATA"); d != "" {
			return d, nil
		}
		return "", errors.New("%LOCALAPPDATA% is not set")
	}
	return os.UserConfigDir()
}
