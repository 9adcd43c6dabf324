// A tiny Go service profiled by pyroscope-go, the reference our profiles are
// compared with (spec/integration/pyroscope_reference_spec.rb, docs/pyroscope-protocol.md).
//
//	PYROSCOPE_URL=http://127.0.0.1:4040 pyroscope_reference -app NAME [-cycles 3] [-tag k=v]...
//
// It does what a Go service does: pyroscope.Start with the four heap types
// (godeltaprof underneath) and the tags given, and a workload that allocates
// and keeps some of it. The differences from a long-running service, and why:
//   - runtime.MemProfileRate is 1 (-mem-profile-rate): every allocation is
//     recorded, so the totals are exact and can be compared with ours;
//   - UploadRate is 1 s (-upload-rate), not 15 s, so a test takes seconds;
//   - each cycle runs the workload once, then runtime.GC(): Go's heap profile
//     is "as of the most recently completed GC", so only then does it show
//     this cycle's objects (pyroscope-go forces a GC before each upload only
//     when none ran since the last one);
//   - it waits for each upload to be answered (an http.Client wrapper sees
//     them), and stops after -cycles uploads. Profiler.Stop does not take a
//     last snapshot in v1.5.0 (the session's ticker just ends, and uploads
//     still queued may be dropped; Profiler.Flush(true) would push one more),
//     so exactly -cycles profiles are pushed.
//
// Stdout: one JSON object with the application name, the tags, and every
// upload (the /ingest query's name, from and until, the HTTP status), for
// the spec to find the series. With -save DIR, each upload's pprof (gzipped,
// as godeltaprof wrote it) and sample_type_config are also written there as
// upload-N.pb.gz and upload-N.json, for the spec to read. Exit status 0 when
// every upload got 200.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/grafana/pyroscope-go"
)

// Objects the workload keeps until its next call: the in-use part.
var kept [][]byte

// The workload: objectsPerCycle objects of objectSize bytes (a size class of
// its own, so the in-use bytes are exact), all kept until the next cycle.
const (
	objectsPerCycle = 2000
	objectSize      = 1024
)

//go:noinline
func allocateGophersForPyroscope() {
	fresh := make([][]byte, 0, objectsPerCycle)
	for i := 0; i < objectsPerCycle; i++ {
		fresh = append(fresh, make([]byte, objectSize))
	}
	kept = fresh
}

type upload struct {
	Name   string `json:"name"`
	From   string `json:"from"`
	Until  string `json:"until"`
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
	At     int64  `json:"at_ms"`
}

// recordingClient is pyroscope-go's HTTP client (Config.HTTPClient) that
// remembers each upload and tells the main loop it is done.
type recordingClient struct {
	client  *http.Client
	saveDir string
	mu      sync.Mutex
	uploads []upload
	done    chan struct{}
}

func (c *recordingClient) Do(req *http.Request) (*http.Response, error) {
	if c.saveDir != "" {
		if err := c.save(req); err != nil {
			fmt.Fprintln(os.Stderr, "pyroscope_reference: -save:", err)
		}
	}
	resp, err := c.client.Do(req)
	q := req.URL.Query()
	u := upload{Name: q.Get("name"), From: q.Get("from"), Until: q.Get("until"), At: time.Now().UnixMilli()}
	if err != nil {
		u.Error = err.Error()
	} else {
		u.Status = resp.StatusCode
	}
	c.mu.Lock()
	c.uploads = append(c.uploads, u)
	c.mu.Unlock()
	c.done <- struct{}{}
	return resp, err
}

// save writes the multipart form's parts (pyroscope-go sets GetBody: the
// body can be read again for the upload itself).
func (c *recordingClient) save(req *http.Request) error {
	_, params, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if err != nil {
		return err
	}
	body, err := req.GetBody()
	if err != nil {
		return err
	}
	c.mu.Lock()
	n := len(c.uploads) + 1
	c.mu.Unlock()
	names := map[string]string{"profile": "pb.gz", "sample_type_config": "json"}
	form := multipart.NewReader(body, params["boundary"])
	for {
		part, err := form.NextPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return err
		}
		if ext, ok := names[part.FormName()]; ok {
			if err := os.WriteFile(filepath.Join(c.saveDir, fmt.Sprintf("upload-%d.%s", n, ext)), data, 0o644); err != nil {
				return err
			}
		}
	}
}

type tagFlags map[string]string

func (t tagFlags) String() string { return fmt.Sprint(map[string]string(t)) }

func (t tagFlags) Set(value string) error {
	k, v, ok := strings.Cut(value, "=")
	if !ok || k == "" {
		return fmt.Errorf("tag %q is not NAME=VALUE", value)
	}
	t[k] = v
	return nil
}

func main() {
	tags := tagFlags{}
	app := flag.String("app", os.Getenv("PYROSCOPE_APPLICATION_NAME"), "application name (default $PYROSCOPE_APPLICATION_NAME)")
	server := flag.String("server", os.Getenv("PYROSCOPE_URL"), "server address (default $PYROSCOPE_URL)")
	cycles := flag.Int("cycles", 3, "uploads to make before stopping")
	rate := flag.Duration("upload-rate", time.Second, "pyroscope-go's UploadRate")
	memRate := flag.Int("mem-profile-rate", 1, "runtime.MemProfileRate (Go's default is 512 KiB)")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long")
	saveDir := flag.String("save", "", "write each upload's pprof and sample_type_config into this directory")
	flag.Var(tags, "tag", "a tag NAME=VALUE, repeatable (default env=e2e)")
	flag.Parse()
	runtime.MemProfileRate = *memRate
	if *app == "" || *server == "" {
		fmt.Fprintln(os.Stderr, "pyroscope_reference: needs -app (or PYROSCOPE_APPLICATION_NAME) and -server (or PYROSCOPE_URL)")
		os.Exit(2)
	}
	if len(tags) == 0 {
		tags["env"] = "e2e"
	}

	client := &recordingClient{
		client: &http.Client{Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		saveDir: *saveDir,
		done:    make(chan struct{}, 16),
	}
	started := time.Now()
	profiler, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: *app,
		ServerAddress:   *server,
		Tags:            tags,
		UploadRate:      *rate,
		HTTPClient:      client,
		ProfileTypes: []pyroscope.ProfileType{
			pyroscope.ProfileAllocObjects, pyroscope.ProfileAllocSpace,
			pyroscope.ProfileInuseObjects, pyroscope.ProfileInuseSpace,
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pyroscope_reference: pyroscope.Start:", err)
		os.Exit(1)
	}
	deadline := time.After(*timeout)
	for i := 0; i < *cycles; i++ {
		allocateGophersForPyroscope()
		runtime.GC()
		select {
		case <-client.done:
		case <-deadline:
			fmt.Fprintf(os.Stderr, "pyroscope_reference: %d of %d uploads after %s\n", i, *cycles, *timeout)
			os.Exit(1)
		}
	}
	_ = profiler.Stop()

	client.mu.Lock()
	defer client.mu.Unlock()
	ok := true
	for _, u := range client.uploads {
		ok = ok && u.Status == http.StatusOK
	}
	out, _ := json.Marshal(map[string]any{
		"app": *app, "tags": tags, "started_at_ms": started.UnixMilli(), "finished_at_ms": time.Now().UnixMilli(),
		"objects_per_cycle": objectsPerCycle, "object_size": objectSize, "uploads": client.uploads,
	})
	fmt.Println(string(out))
	if !ok {
		io.WriteString(os.Stderr, "pyroscope_reference: an upload failed\n")
		os.Exit(1)
	}
}
