package main

// The wire protocol (docs/reconcile.md, "The renderer"): every message is a frame, a 4-byte
// big-endian length followed by that many bytes of one JSON object. The renderer first writes a
// hello frame; then the operator writes request frames and the renderer answers each with one
// response frame carrying the same id, in completion order (not request order).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// maxRequest bounds a request frame; a bigger length means a broken channel.
const maxRequest = 64 << 20

type hello struct {
	Hello helloBody `json:"hello"`
}

type helloBody struct {
	Helm string `json:"helm"`
	Go   string `json:"go"`
}

// request is one `helm template` call: the same inputs as its flags.
type request struct {
	ID          uint64   `json:"id"`
	Chart       string   `json:"chart"`
	Release     string   `json:"release"`
	Namespace   string   `json:"namespace"`
	Values      string   `json:"values"`
	KubeVersion string   `json:"kubeVersion"`
	APIVersions []string `json:"apiVersions"`
	IsUpgrade   bool     `json:"isUpgrade"`
	IncludeCRDs bool     `json:"includeCrds"`
	SkipTests   bool     `json:"skipTests"`
	MaxOutput   int      `json:"maxOutput"`
}

const (
	kindHelm           = "helm"
	kindOutputTooLarge = "outputTooLarge"
	kindPanic          = "panic"
)

// failure is why a render failed. A message longer than maxMessage is sent as its start
// (Message), the count of the bytes left out (Omitted) and its end (Tail).
type failure struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Omitted int    `json:"omitted,omitempty"`
	Tail    string `json:"tail,omitempty"`
}

// response carries either the manifest or the error.
type response struct {
	ID       uint64   `json:"id"`
	Manifest *string  `json:"manifest,omitempty"`
	Error    *failure `json:"error,omitempty"`
}

func readFrame(r io.Reader, v any) error {
	var header [4]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(header[:])
	if n > maxRequest {
		return fmt.Errorf("frame of %d bytes exceeds %d", n, maxRequest)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("frame body: %w", err)
	}
	return json.Unmarshal(body, v)
}

// frameWriter writes whole frames, one at a time, and flushes each.
type frameWriter struct {
	mu sync.Mutex
	w  interface {
		io.Writer
		Flush() error
	}
}

func (f *frameWriter) write(v any) error {
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	// Manifests are YAML, not HTML: keep <, > and & as they are (smaller frames).
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b := bytes.TrimSuffix(body.Bytes(), []byte("\n"))
	var header [4]byte
	binary.BigEndian.PutUint32(header[:], uint32(len(b)))
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.w.Write(header[:]); err != nil {
		return err
	}
	if _, err := f.w.Write(b); err != nil {
		return err
	}
	return f.w.Flush()
}
