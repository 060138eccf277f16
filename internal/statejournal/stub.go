package statejournal

// TEMPORARY stub until the journal branch lands.

import "log/slog"

type Options struct {
	MaxRecordBytes int
	Logger         *slog.Logger
	NoSync         bool
}
type Stats struct{ Records, Bytes, Groups, Failures, Compactions, CompactionFailures, TornTails, TornBytes uint64 }
type Journal struct{}

func Open(path string, opt Options) (*Journal, [][]byte, error)              { return &Journal{}, nil, nil }
func (j *Journal) Append(p []byte) (uint64, error)                           { return 0, nil }
func (j *Journal) Wait(seq uint64) error                                     { return nil }
func (j *Journal) Sync() error                                               { return nil }
func (j *Journal) Compact(snapshot func(emit func([]byte) error) error) bool { return false }
func (j *Journal) Size() int64                                               { return 0 }
func (j *Journal) Close() error                                              { return nil }
func (j *Journal) Stats() Stats                                              { return Stats{} }
