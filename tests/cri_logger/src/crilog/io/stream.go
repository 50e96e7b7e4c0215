// The stream types of containerd v1.6.20 pkg/cri/io/helpers.go (the rest of that
// file, attaching to containers, is not needed to write logs).

package io

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamType is the type of the stream, stdout/stderr.
type StreamType string

const (
	// Stdout stream type.
	Stdout StreamType = StreamType(runtime.Stdout)
	// Stderr stream type.
	Stderr StreamType = StreamType(runtime.Stderr)
)
