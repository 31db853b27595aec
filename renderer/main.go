// Command renderer renders Helm charts exactly as the pinned `helm template` does, many at once,
// for module-manager: one long-lived child process per replica, spoken to over stdin/stdout in
// length-prefixed JSON frames (protocol.go; docs/reconcile.md). Each request runs in its own
// goroutine with its own action.Configuration, so renders share nothing but the process.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// maxMessage bounds the text of a failure in a response (its start and its end are kept, like
// the output is capped): a template's `fail` can build an error of any size, and JSON escapes a
// control byte into 6, so an unbounded error could outgrow the frame the operator accepts.
const maxMessage = 64 << 10

func main() {
	memoryLimit := flag.Int64("memory-limit", 512<<20, "bytes of Go heap after which the renderer exits with status 3")
	version := flag.Bool("version", false, "print the helm version rendered with and exit")
	flag.Parse()
	if *version {
		fmt.Printf("%s %s\n", helmVersion(), goVersion())
		return
	}
	disableNetwork()
	watchMemory(*memoryLimit)

	out := &frameWriter{w: bufio.NewWriterSize(protocolOutput(), 64<<10)}
	if err := out.write(hello{Hello: helloBody{Helm: helmVersion(), Go: goVersion()}}); err != nil {
		fatal(fmt.Errorf("write hello: %w", err))
	}
	in := bufio.NewReaderSize(os.Stdin, 64<<10)
	var wg sync.WaitGroup
	for {
		var req request
		err := readFrame(in, &req)
		if errors.Is(err, io.EOF) {
			// The operator closed our stdin: it is gone or wants us gone. Renders still running
			// have nobody to answer to.
			os.Exit(0)
		}
		if err != nil {
			fatal(fmt.Errorf("read request: %w", err))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := out.write(serve(&req)); err != nil {
				fatal(fmt.Errorf("write response %d: %w", req.ID, err))
			}
		}()
	}
}

// fatal reports a broken channel to the operator (it reads our stderr) and exits.
func fatal(err error) {
	fmt.Fprintf(os.Stderr, "renderer: %v\n", err)
	os.Exit(2)
}

// serve renders one request; a panic anywhere in it fails that request only.
func serve(req *request) (resp response) {
	resp.ID = req.ID
	defer func() {
		if r := recover(); r != nil {
			resp = response{ID: req.ID, Error: bounded(kindPanic, fmt.Sprintf("renderer panicked: %v", r))}
		}
	}()
	manifest, err := template(req)
	switch {
	case err != nil:
		resp.Error = bounded(kindHelm, err.Error())
	case req.MaxOutput > 0 && len(manifest) > req.MaxOutput:
		resp.Error = &failure{Kind: kindOutputTooLarge, Message: fmt.Sprintf("output of %d bytes exceeds the limit of %d", len(manifest), req.MaxOutput)}
	default:
		resp.Manifest = &manifest
	}
	return resp
}

// bounded is a failure whose text is at most maxMessage bytes: when longer, its first and last
// maxMessage/2 bytes (cut at character boundaries) and the count of the bytes between them.
func bounded(kind, message string) *failure {
	if len(message) <= maxMessage {
		return &failure{Kind: kind, Message: message}
	}
	head := maxMessage / 2
	for head > 0 && !utf8.RuneStart(message[head]) {
		head--
	}
	tail := len(message) - maxMessage/2
	for tail < len(message) && !utf8.RuneStart(message[tail]) {
		tail++
	}
	return &failure{Kind: kind, Message: message[:head], Omitted: tail - head, Tail: message[tail:]}
}

// protocolOutput is a private copy of fd 1 for the frames; fd 1 itself then points at stderr, so
// that a stray print to stdout (ours or a library's) lands in the operator's log instead of
// inside a frame, where it would break the protocol and stop every render in flight.
func protocolOutput() *os.File {
	fd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		fatal(fmt.Errorf("duplicate stdout for the frames: %w", err))
	}
	if err := unix.Dup2(2, 1); err != nil {
		fatal(fmt.Errorf("point stdout at stderr: %w", err))
	}
	return os.NewFile(uintptr(fd), "frames")
}
