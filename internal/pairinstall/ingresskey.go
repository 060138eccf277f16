package pairinstall

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// IngressKeyFileName is the key of the ingress mark (spec 3.5.3) in the
// app dir: the secret that lets this node, and only it, tell the broker's
// replay of a producer's job from the broker's own.
const IngressKeyFileName = "workload-manager.ingress-key"

// ingressKeyBytes is the key's length: 256 bits, HMAC-SHA256's output,
// written as 64 hexadecimal digits and a newline.
const ingressKeyBytes = 32

// IngressKey is the app dir's ingress mark key and what finding it did.
type IngressKey struct {
	Key  []byte
	Path string
	// Created says this start made the key: no file held one.
	Created bool
	// Notice, when set, is a warning to log: a file that was not a key
	// was set aside for a new one.
	Notice string
}

// LoadIngressKey returns the app dir's ingress mark key, making one when
// there is none. A file at its name that is not a key (not a regular
// file, not 64 hexadecimal digits) is moved aside to
// <name>.aside-<unixnano> and a new key made: the marks the old key made
// then no longer check, which costs what the mark saves and never a start.
// An error says no key could be read or made.
func LoadIngressKey(appDir string) (IngressKey, error) {
	path := filepath.Join(appDir, IngressKeyFileName)
	b, err := ReadBounded(path)
	if err == nil {
		key, perr := parseIngressKey(b)
		if perr == nil {
			return IngressKey{Key: key, Path: path}, nil
		}
		err = perr
	}
	var notice string
	if !errors.Is(err, os.ErrNotExist) {
		aside := path + ".aside-" + strconv.FormatInt(time.Now().UnixNano(), 10)
		if rerr := os.Rename(path, aside); rerr != nil {
			return IngressKey{}, fmt.Errorf("ingress mark key %s: %v, and it cannot be set aside: %w", path, err, rerr)
		}
		notice = fmt.Sprintf("%s was not a key (%v): moved aside to %s; a new key was made, and the marks of the old one no longer check", path, err, aside)
	}
	key, err := createIngressKey(appDir, path)
	if err != nil {
		return IngressKey{}, err
	}
	return IngressKey{Key: key, Path: path, Created: true, Notice: notice}, nil
}

// parseIngressKey reads a key file's content.
func parseIngressKey(b []byte) ([]byte, error) {
	text := strings.TrimSpace(string(b))
	key, err := hex.DecodeString(text)
	if err != nil || len(key) != ingressKeyBytes {
		return nil, fmt.Errorf("not %d hexadecimal digits", 2*ingressKeyBytes)
	}
	return key, nil
}

// createIngressKey makes a new random key at path and returns the key the
// file holds afterwards: another process's, when it made one first.
func createIngressKey(appDir, path string) ([]byte, error) {
	key := make([]byte, ingressKeyBytes)
	_, _ = rand.Read(key) // crypto/rand.Read never fails on supported platforms
	err := linkNewFile(appDir, path, []byte(hex.EncodeToString(key)+"\n"))
	if errors.Is(err, os.ErrExist) {
		b, rerr := ReadBounded(path)
		if rerr != nil {
			return nil, fmt.Errorf("ingress mark key %s: %w", path, rerr)
		}
		return parseIngressKey(b)
	}
	if err != nil {
		return nil, fmt.Errorf("write ingress mark key %s: %w", path, err)
	}
	return key, nil
}
