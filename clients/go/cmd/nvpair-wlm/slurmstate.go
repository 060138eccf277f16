package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// The Slurm bridge's state file: what it reported of each job still in
// Slurm's view, so that a restarted bridge gives each job the id it had,
// tells a job from one that took its job id after a Slurm state wipe, and
// knows which jobs it must settle. It is written whole to a synced
// temporary file renamed over the old one, so a crash leaves one or the
// other, never half; one that cannot be read is one warning and a start
// from the read-back alone. It is written before the frames it records
// are handed to the client, so the seq it holds is never below what the
// node was sent.

// tracked is what the bridge keeps of one job.
type tracked struct {
	Key       string `json:"key"`               // the job within its Slurm ("12", "45_2")
	ID        string `json:"id"`                // the workload id
	RunID     string `json:"runId"`             // the workload's current run
	Runs      int    `json:"runs,omitempty"`    // runs started after the first (Rerun)
	Submit    int64  `json:"submit"`            // Slurm's submit time when first seen, epoch s: part of the id
	LastSub   int64  `json:"lastSubmit"`        // Slurm's submit time last seen (a requeue moves it)
	Restarts  int64  `json:"restarts"`          // Slurm's restart_cnt last seen
	State     string `json:"state"`             // the state last asked for; "removed" after a removal
	Seq       int64  `json:"seq"`               // the seq of the frame last asked for
	Model     string `json:"model"`             // the workload's model: the job's name
	Requester string `json:"requester"`         // the workload's requesterId: slurm/<user>
	Created   int64  `json:"createdAt"`         // epoch ms
	Started   int64  `json:"startedAt"`         // epoch ms, 0 when it never ran
	Ended     int64  `json:"endedAt"`           // epoch ms, 0 while live
	Error     string `json:"error,omitempty"`   // the reason of a failed or cancelled end
	LostEnd   string `json:"lostEnd,omitempty"` // an end the file recorded that the node never got, sent when the job is settled
	Expired   bool   `json:"expired,omitempty"` // the node ended it for a lease that ran out, not for Slurm
	Reported  bool   `json:"-"`                 // the node is known to hold State (read back, or sent by this process)
	seen      bool   // in the latest view (one poll's scratch)
	submitted bool   // this poll's actions make its client job (one poll's scratch)
}

// live reports whether the job's workload is queued or running.
func (t *tracked) live() bool { return t.State == "queued" || t.State == "running" }

// stateFile is the file's content.
type stateFile struct {
	Version int        `json:"version"`
	Jobs    []*tracked `json:"jobs"`
}

const stateFileVersion = 1

// loadState reads the state file at path: the jobs it holds, none when it
// does not exist. A file that cannot be read whole is an error, which the
// bridge logs before it starts from the read-back alone.
func loadState(path string) ([]*tracked, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if f.Version != stateFileVersion {
		return nil, fmt.Errorf("state file %s: version %d, this bridge reads %d", path, f.Version, stateFileVersion)
	}
	for _, t := range f.Jobs {
		if t == nil || t.Key == "" || t.ID == "" {
			return nil, fmt.Errorf("state file %s: a job without its key or id", path)
		}
	}
	return f.Jobs, nil
}

// saveState writes jobs to path atomically: a synced temporary file in the
// same directory, renamed over it, and the directory synced.
func saveState(path string, jobs []*tracked) error {
	b, err := json.Marshal(stateFile{Version: stateFileVersion, Jobs: jobs})
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("state file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
