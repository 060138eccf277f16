package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The Slurm bridge's mapping from Slurm's job states to a workload's
// (docs/producer-guide.md has the table): waiting is queued, holding
// resources is running, and each end is the workload's end with Slurm's
// words for why.
var stateOf = map[string]string{
	"PENDING": "queued", "SUSPENDED": "queued",
	"RUNNING":   "running",
	"COMPLETED": "completed",
	"FAILED":    "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
	"BOOT_FAIL": "failed", "DEADLINE": "failed", "PREEMPTED": "failed",
	"CANCELLED": "cancelled",
}

// Flags that decide before the base state: a job being requeued waits
// again whatever its base says, and one configuring (its nodes booting)
// or completing (its epilog running) still holds its resources. 22.05
// writes only the flag's name, so these are also its job_state strings.
var (
	queuedFlags  = []string{"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"}
	runningFlags = []string{"CONFIGURING", "COMPLETING"}
)

// workloadState is the workload state j shows as, or "" when its state is
// none the bridge knows (it then keeps what it reported, and says so).
func workloadState(j sjob) string {
	for _, f := range j.Flags {
		if slices.Contains(queuedFlags, f) {
			return "queued"
		}
	}
	for _, f := range j.Flags {
		if slices.Contains(runningFlags, f) {
			return "running"
		}
	}
	return stateOf[j.State]
}

// isTerminal reports whether a workload state ends the workload.
func isTerminal(state string) bool {
	return state == "completed" || state == "failed" || state == "cancelled"
}

// endReason is the error a failed or cancelled job carries: Slurm's state,
// its reason and how the job ended, as Slurm gives them.
func endReason(j sjob) string {
	reason := j.Reason
	if reason == "" {
		reason = "None"
	}
	return fmt.Sprintf("Slurm job %s ended %s (reason %s, %s)", j.Key, j.State, reason, j.Exit)
}

// maxArrayTasks bounds the tasks one pending array's task string expands
// to: Slurm's own MaxArraySize default is 1001; a string naming more is
// expanded only this far, and the bridge's --max-jobs bounds the rest.
const maxArrayTasks = 100_000

// expandTasks reads a pending array's array_task_string ("0-2",
// "1,3,5-7", "0-99%4", "1-9:2") into its task indexes, at most limit of
// them. Slurm splits a task off into a job of its own when it starts; until
// then the array is one record, and each task is a job of the Jobs list.
func expandTasks(s string, limit int) ([]int64, error) {
	s, _, _ = strings.Cut(s, "%") // the most tasks run at once
	var out []int64
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, step, err := taskRange(part)
		if err != nil {
			return nil, fmt.Errorf("array tasks %q: %w", clipText(s, 64), err)
		}
		for i := lo; i <= hi; i += step {
			if len(out) >= limit {
				return out, nil
			}
			out = append(out, i)
		}
	}
	return out, nil
}

// taskRange reads "a", "a-b" or "a-b:step".
func taskRange(part string) (lo, hi, step int64, err error) {
	step = 1
	rng, st, hasStep := strings.Cut(part, ":")
	if hasStep {
		if step, err = strconv.ParseInt(st, 10, 64); err != nil || step <= 0 {
			return 0, 0, 0, fmt.Errorf("bad step %q", st)
		}
	}
	a, b, isRange := strings.Cut(rng, "-")
	if lo, err = strconv.ParseInt(a, 10, 64); err != nil || lo < 0 {
		return 0, 0, 0, fmt.Errorf("bad index %q", a)
	}
	hi = lo
	if isRange {
		if hi, err = strconv.ParseInt(b, 10, 64); err != nil || hi < lo {
			return 0, 0, 0, fmt.Errorf("bad range %q", rng)
		}
	}
	return lo, hi, step, nil
}

// expandArrays replaces each pending array not split yet with one job per
// task, each keyed as the task it is (array_task), so that a task keeps
// its workload when Slurm splits it off. Other records pass as they are
// (squeue's output bound bounds them); at most limit tasks are made, and
// dropped counts the arrays or tasks left out.
func expandArrays(jobs []sjob, limit int) (out []sjob, dropped int) {
	made := 0
	for _, j := range jobs {
		if j.Tasks == "" {
			out = append(out, j)
			continue
		}
		tasks, err := expandTasks(j.Tasks, maxArrayTasks)
		if err != nil || len(tasks) == 0 {
			dropped++
			continue
		}
		take := min(len(tasks), limit-made)
		dropped += len(tasks) - take
		for _, t := range tasks[:take] {
			task := j
			task.TaskID, task.Tasks = t, ""
			task.Key = jobKey(j.JobID, j.ArrayJobID, t)
			out = append(out, task)
		}
		made += take
	}
	return out, dropped
}
