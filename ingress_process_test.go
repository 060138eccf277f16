package main

// curlFrame is the seed document's producer example, as a producer sends it:
// no originatedFrom, a field of the producer's own in workloadInfo.
const curlFrame = `{
  "jsonrpc": "2.0", "method": "workload:started",
  "params": {"workloadInfo": {"id": "job-42", "runId": "job-42", "seq": 1, "model": "qwen3.5-9b", "engine": "llamacpp",
             "state": "running", "createdAt": 1789661457000, "startedAt": 1789661457000,
             "completedAt": null, "error": null, "requesterId": "my-scheduler", "harnessSlot": 3}}}`
