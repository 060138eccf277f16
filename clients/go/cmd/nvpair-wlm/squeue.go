package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// What the Slurm bridge reads: the output of `squeue --json`, Slurm's own
// view of its jobs. Its shape changed across releases, and the reader
// takes each:
//
//   - 22.05 (openapi/v0.0.38, Debian 12's slurm-wlm): times are epoch
//     seconds with 0 for unset; job_state is one string, a flag's name
//     when the job carries one (COMPLETING, CONFIGURING, REQUEUED, ...)
//     else the base state's; exit_code is the raw wait status (768 for
//     `exit 3`, 15 for SIGTERM); array_task_id is null when none.
//   - 23.02 on (data_parser v0.0.39 and later): a number that can be
//     unset or infinite is {"set", "infinite", "number"}; job_state is an
//     array, the base state and then the flags; exit_code is
//     {"status": [...], "return_code": N, "signal": {"id"|"signal_id": N,
//     "name": ...}}, where N may itself be the {"set", ...} object.
//
// 22.05 ignores -j and -t with --json and lists every job, the finished
// ones included until MinJobAge (300 s by default) has passed; so does
// this reader: it takes the whole list and picks this node's jobs itself.

// sjob is one Slurm job as the bridge needs it, whatever release wrote it.
type sjob struct {
	Key        string // "123", or "45_2" for task 2 of array job 45
	JobID      int64
	ArrayJobID int64  // 0 when not an array task
	TaskID     int64  // the array task's index, -1 when none
	Tasks      string // the task indexes of a pending array not split yet ("0-2"), else ""
	Name       string
	User       string
	Cluster    string
	State      string   // the base state: PENDING, RUNNING, COMPLETED, ...
	Flags      []string // the flags it carries: COMPLETING, CONFIGURING, REQUEUED, ...
	Reason     string   // state_reason
	Exit       exitStatus
	Submit     time.Time // zero when unset
	Start      time.Time
	End        time.Time
	BatchHost  string // the node that runs (ran) the batch script; "" before one is allocated
	Restarts   int64  // restart_cnt: how often the job was requeued
}

// exitStatus is how a job ended: its exit code, or the signal that
// killed it.
type exitStatus struct {
	Known  bool
	Code   int64
	Signal int64 // 0 when none
	Name   string
}

// String says it as the Jobs list's error does.
func (e exitStatus) String() string {
	switch {
	case !e.Known:
		return "exit status unknown"
	case e.Signal != 0 && e.Name != "":
		return fmt.Sprintf("killed by signal %d (%s)", e.Signal, e.Name)
	case e.Signal != 0:
		return fmt.Sprintf("killed by signal %d", e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// baseStates are Slurm's base job states (slurm.h, enum job_states); a
// job_state array names one of them and then the job's flags.
var baseStates = map[string]bool{
	"PENDING": true, "RUNNING": true, "SUSPENDED": true, "COMPLETED": true, "CANCELLED": true,
	"FAILED": true, "TIMEOUT": true, "NODE_FAIL": true, "PREEMPTED": true, "BOOT_FAIL": true,
	"DEADLINE": true, "OUT_OF_MEMORY": true,
}

// squeueView is one answer of squeue --json.
type squeueView struct {
	Jobs    []sjob
	Release string // meta's Slurm release ("22.05.8"), "" when it names none
}

// errTooLarge is squeue output over the bound the bridge reads.
var errTooLarge = errors.New("squeue output over --squeue-max-bytes")

// limitedReader reads at most n bytes and fails with errTooLarge past them,
// so output over the bound is an error, never a silently cut list.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			return 0, errTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// parseSqueue reads squeue --json output from r, at most maxBytes of it,
// one job at a time (a job's record is a few KiB; the whole output of
// thousands of jobs is never held). An answer whose "errors" list is not
// empty is an error: Slurm could not say what it holds.
func parseSqueue(r io.Reader, maxBytes int64) (squeueView, error) {
	dec := json.NewDecoder(&limitedReader{r: r, n: maxBytes})
	dec.UseNumber()
	var v squeueView
	if err := expectDelim(dec, '{'); err != nil {
		return v, err
	}
	sawJobs := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return v, err
		}
		key, _ := tok.(string)
		switch key {
		case "jobs":
			sawJobs = true
			if err := expectDelim(dec, '['); err != nil {
				return v, err
			}
			for dec.More() {
				var raw rawJob
				if err := dec.Decode(&raw); err != nil {
					return v, fmt.Errorf("squeue --json: a job: %w", err)
				}
				j, err := raw.job()
				if err != nil {
					return v, err
				}
				v.Jobs = append(v.Jobs, j)
			}
			if err := expectDelim(dec, ']'); err != nil {
				return v, err
			}
		case "errors":
			var errs []struct {
				Error       string `json:"error"`
				Description string `json:"description"`
			}
			if err := dec.Decode(&errs); err != nil {
				return v, fmt.Errorf("squeue --json: errors: %w", err)
			}
			if len(errs) > 0 {
				return v, fmt.Errorf("squeue --json reports an error: %s", clipText(strings.TrimSpace(errs[0].Error+" "+errs[0].Description), 200))
			}
		case "meta":
			var meta struct {
				Slurm map[string]json.RawMessage `json:"Slurm"` // 22.05
				Lower map[string]json.RawMessage `json:"slurm"` // later releases
			}
			if err := dec.Decode(&meta); err != nil {
				return v, fmt.Errorf("squeue --json: meta: %w", err)
			}
			for _, m := range []map[string]json.RawMessage{meta.Slurm, meta.Lower} {
				var rel string
				if json.Unmarshal(m["release"], &rel) == nil && rel != "" {
					v.Release = rel
				}
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return v, err
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return v, err
	}
	if !sawJobs {
		return v, errors.New("squeue --json: the answer has no jobs list")
	}
	return v, nil
}

// expectDelim reads the next token and fails unless it is d.
func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return err
		}
		return fmt.Errorf("squeue --json: %w", err)
	}
	if tok != d {
		return fmt.Errorf("squeue --json: found %v where %q belongs", tok, d)
	}
	return nil
}

// rawJob is the part of a job's record the bridge reads; json skips the
// rest. The fields whose shape changed are kept raw.
type rawJob struct {
	JobID       json.RawMessage `json:"job_id"`
	ArrayJobID  json.RawMessage `json:"array_job_id"`
	ArrayTaskID json.RawMessage `json:"array_task_id"`
	ArrayTasks  string          `json:"array_task_string"`
	Name        string          `json:"name"`
	UserName    string          `json:"user_name"`
	Cluster     string          `json:"cluster"`
	JobState    json.RawMessage `json:"job_state"`
	StateReason string          `json:"state_reason"`
	ExitCode    json.RawMessage `json:"exit_code"`
	SubmitTime  json.RawMessage `json:"submit_time"`
	StartTime   json.RawMessage `json:"start_time"`
	EndTime     json.RawMessage `json:"end_time"`
	BatchHost   string          `json:"batch_host"`
	RestartCnt  json.RawMessage `json:"restart_cnt"`
}

// job reads the record whatever its release.
func (r rawJob) job() (sjob, error) {
	id, ok := number(r.JobID)
	if !ok || id <= 0 {
		return sjob{}, fmt.Errorf("squeue --json: a job without a job_id (%s)", clipText(string(r.JobID), 40))
	}
	j := sjob{JobID: id, TaskID: -1, Name: r.Name, User: r.UserName, Cluster: r.Cluster,
		Reason: r.StateReason, BatchHost: r.BatchHost}
	j.ArrayJobID, _ = number(r.ArrayJobID)
	if task, ok := number(r.ArrayTaskID); ok && j.ArrayJobID > 0 {
		j.TaskID = task
	}
	if j.ArrayJobID > 0 && j.TaskID < 0 {
		j.Tasks = r.ArrayTasks
	}
	j.State, j.Flags = jobState(r.JobState)
	j.Exit = exitOf(r.ExitCode)
	j.Submit, j.Start, j.End = epoch(r.SubmitTime), epoch(r.StartTime), epoch(r.EndTime)
	j.Restarts, _ = number(r.RestartCnt)
	j.Key = jobKey(j.JobID, j.ArrayJobID, j.TaskID)
	return j, nil
}

// jobKey names a job within one Slurm: an array task by its array and
// index, which stay its own while Slurm splits a pending array into
// tasks with job ids of their own, and any other job by its id.
func jobKey(jobID, arrayJobID, taskID int64) string {
	if arrayJobID > 0 && taskID >= 0 {
		return strconv.FormatInt(arrayJobID, 10) + "_" + strconv.FormatInt(taskID, 10)
	}
	return strconv.FormatInt(jobID, 10)
}

// number reads an integer written as a number or as 23.02's {"set",
// "infinite", "number"}; ok is false for null, unset, infinite or anything
// else.
func number(raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == 'n' {
		return 0, false
	}
	if raw[0] == '{' {
		var o struct {
			Set      *bool           `json:"set"`
			Infinite bool            `json:"infinite"`
			Number   json.RawMessage `json:"number"`
		}
		if json.Unmarshal(raw, &o) != nil || (o.Set != nil && !*o.Set) || o.Infinite {
			return 0, false
		}
		return number(o.Number)
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	if i, err := n.Int64(); err == nil {
		return i, true
	}
	if f, err := n.Float64(); err == nil && f == float64(int64(f)) {
		return int64(f), true
	}
	return 0, false
}

// epoch reads a time in epoch seconds; zero when unset or 0.
func epoch(raw json.RawMessage) time.Time {
	s, ok := number(raw)
	if !ok || s <= 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

// jobState reads job_state: 22.05's one string (a flag's name when the
// job carries one) or the array of later releases (the base state, then
// the flags). The base state is "" when the string names a flag.
func jobState(raw json.RawMessage) (base string, flags []string) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if baseStates[one] {
			return one, nil
		}
		return "", []string{one}
	}
	var many []string
	if json.Unmarshal(raw, &many) != nil {
		return "", nil
	}
	for _, s := range many {
		if base == "" && baseStates[s] {
			base = s
			continue
		}
		flags = append(flags, s)
	}
	return base, flags
}

// exitOf reads exit_code: 22.05's raw wait status (the low 7 bits the
// signal, else the code in the next 8) or the object of later releases.
func exitOf(raw json.RawMessage) exitStatus {
	if status, ok := number(raw); ok {
		if sig := status & 0x7f; sig != 0 {
			return exitStatus{Known: true, Signal: sig}
		}
		return exitStatus{Known: true, Code: (status >> 8) & 0xff}
	}
	var o struct {
		ReturnCode json.RawMessage `json:"return_code"`
		Signal     struct {
			ID       json.RawMessage `json:"id"`
			SignalID json.RawMessage `json:"signal_id"`
			Name     string          `json:"name"`
		} `json:"signal"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return exitStatus{}
	}
	e := exitStatus{}
	if sig, ok := number(o.Signal.ID); ok && sig > 0 {
		e = exitStatus{Known: true, Signal: sig, Name: o.Signal.Name}
	} else if sig, ok := number(o.Signal.SignalID); ok && sig > 0 {
		e = exitStatus{Known: true, Signal: sig, Name: o.Signal.Name}
	} else if code, ok := number(o.ReturnCode); ok {
		e = exitStatus{Known: true, Code: code}
	}
	return e
}

// clipText cuts s to at most n bytes on a UTF-8 boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func isRuneStart(b byte) bool { return b&0xc0 != 0x80 }
