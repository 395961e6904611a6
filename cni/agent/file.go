package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// MaxNodesFile bounds the size of a nodes file.
const MaxNodesFile = 4 << 20

// FileSource reads the nodes from a JSON file, an array of {"name", "address", "podCIDRs"}
// (the static mode, for clusters the agent cannot watch), and signals a change when its
// contents change (looked at every Poll).
type FileSource struct {
	Path    string
	Poll    time.Duration
	changed chan struct{}
	stop    chan struct{}
}

// NewFileSource watches path.
func NewFileSource(path string, poll time.Duration) *FileSource {
	f := &FileSource{Path: path, Poll: poll, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	go f.watch()
	return f
}

// Close stops watching.
func (f *FileSource) Close() { close(f.stop) }

func (f *FileSource) read() ([]byte, error) {
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, MaxNodesFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxNodesFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", f.Path, MaxNodesFile)
	}
	return b, nil
}

func (f *FileSource) watch() {
	last, lastErr := f.read()
	t := time.NewTicker(f.Poll)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		b, err := f.read()
		// a change is new contents, or a new reason the file cannot be read (a file that
		// stays unreadable is not a change: the agent's own retry covers it)
		if (err == nil) == (lastErr == nil) && bytes.Equal(b, last) &&
			(err == nil || err.Error() == lastErr.Error()) {
			continue
		}
		last, lastErr = b, err
		notify(f.changed)
	}
}

// Nodes reads and parses the file.
func (f *FileSource) Nodes() ([]Node, error) {
	b, err := f.read()
	if err != nil {
		return nil, err
	}
	var nodes []Node
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&nodes); err != nil {
		return nil, fmt.Errorf("%s: %w (want a JSON array of {\"name\", \"address\", \"podCIDRs\"})", f.Path, err)
	}
	return nodes, nil
}

// Changed is signalled when the file's contents change.
func (f *FileSource) Changed() <-chan struct{} { return f.changed }
