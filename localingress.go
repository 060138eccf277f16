package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"nvpair-workload-manager/internal/httpguard"
)

// ingressConfigFile, under the app directory, turns the ingress on when the
// broker starts the daemon without --local-ingress.
const ingressConfigFile = "workload-ingress.json"

// resolveIngressAddr returns the ingress address: the flag's when given,
// else the listen address in <appDir>/workload-ingress.json. An absent or
// empty file means off.
//
// **Decision** (spec 3.5): any bad value in the file also means off, with
// one ERROR line naming the file, saying what is wrong and showing a valid
// file, and the daemon goes on relaying. The file is read at every start,
// and PAIR's supervisor restarts a worker that exits: were a bad file fatal,
// the node would loop with its relay down until someone fixed it. A bad
// value is JSON that is not one object, a member other than "listen" spelt
// exactly so (the frames refuse case variants; so does the file), or an
// address that is not loopback with a numeric port. A bad flag still fails
// the start: the operator is there to read it.
func resolveIngressAddr(flagAddr, appDir string, log *slog.Logger) (string, error) {
	if flagAddr != "" {
		return flagAddr, nil
	}
	path := filepath.Join(appDir, ingressConfigFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err == nil && len(strings.TrimSpace(string(b))) == 0 {
		return "", nil
	}
	if err == nil {
		var addr string
		if addr, err = parseIngressConfig(b); err == nil {
			return addr, nil
		}
	}
	log.Error("local ingress off: "+ingressConfigFile+" is not usable; the daemon relays without it",
		"file", path, "reason", httpguard.ClipReason(err.Error()), "valid", validIngressConfig)
	return "", nil
}

// validIngressConfig is the example the error line shows.
const validIngressConfig = `{"listen": "127.0.0.1:14324"}`

// parseIngressConfig reads the file's one member, "listen", and checks its
// address is loopback with a numeric port.
func parseIngressConfig(b []byte) (string, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil || members == nil {
		return "", errors.New("not a JSON object")
	}
	for name := range members {
		if name != "listen" {
			return "", fmt.Errorf("unknown member %q: the file has one member, \"listen\"", name)
		}
	}
	raw, ok := members["listen"]
	if !ok {
		return "", errors.New(`no "listen" member`)
	}
	var addr string
	if err := json.Unmarshal(raw, &addr); err != nil || addr == "" {
		return "", errors.New(`"listen" is not a HOST:PORT string`)
	}
	if err := httpguard.CheckLoopbackBind(addr); err != nil {
		return "", fmt.Errorf("listen %q: %w", addr, err)
	}
	return addr, nil
}
