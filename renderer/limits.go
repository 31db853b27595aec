package main

// The renderer's own guards: a memory limit it enforces on itself, no network, and its version.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// exitMemory is the exit status after the heap outgrew the limit; the operator maps it to
// "memory limit exceeded".
const exitMemory = 3

// watchMemory makes the garbage collector work hard near the limit (a soft limit at 3/4 of it)
// and exits with exitMemory once the live heap passes it anyway. Go cannot stop one goroutine's
// template from allocating, so the whole process goes; the operator restarts it.
func watchMemory(limit int64) {
	if limit <= 0 {
		return
	}
	debug.SetMemoryLimit(limit / 4 * 3)
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		for range time.Tick(10 * time.Millisecond) {
			metrics.Read(sample)
			if used := int64(sample[0].Value.Uint64()); used > limit {
				runtime.GC()
				metrics.Read(sample)
				if used = int64(sample[0].Value.Uint64()); used > limit {
					fmt.Fprintf(os.Stderr, "renderer: heap of %d bytes exceeds the memory limit of %d bytes\n", used, limit)
					os.Exit(exitMemory)
				}
			}
		}
	}()
}

var errNoNetwork = errors.New("renderer: network access is disabled")

// disableNetwork makes every dial through the default HTTP transport and resolver fail: a
// client-only `helm template` never dials (`lookup` has no client), and this keeps it so.
func disableNetwork() {
	refuse := func(context.Context, string, string) (net.Conn, error) { return nil, errNoNetwork }
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t.Proxy = nil
		t.DialContext = refuse
	}
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: refuse}
}

// helmVersion is the version of the helm.sh/helm/v4 module this binary was built with.
func helmVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "helm.sh/helm/v4" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func goVersion() string { return runtime.Version() }
