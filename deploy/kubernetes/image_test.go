package kubernetes

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/causet/projection-worker/internal/deploytest"
	"github.com/causet/projection-worker/internal/testtool"
)

// ociDescriptor, ociManifest and ociImageConfig are the parts of an OCI
// image layout (image-spec) this test reads.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
}

type ociManifest struct {
	Config ociDescriptor   `json:"config"`
	Layers []ociDescriptor `json:"layers"`
}

type ociImageConfig struct {
	Config struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// TestImage runs `make image` as CI can, with no registry: the binaries
// built on this machine (BINARIES=prebuilt) on an empty base
// (RUNTIME_IMAGE=scratch), into a buildah store of its own. It then reads
// the image's config (a numeric non-root user, the runAsUser of the
// manifests; projection-worker as the entrypoint, run as the command; the
// version label), extracts its layers and runs both binaries' `version`
// from them, and checks that every command the manifests give exists in
// the image.
func TestImage(t *testing.T) {
	buildah := testtool.Require(t, "buildah")
	makeTool := testtool.Require(t, "make")
	root, err := deploytest.Root()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	global := fmt.Sprintf("--root %s --runroot %s --storage-driver vfs", filepath.Join(tmp, "storage"), filepath.Join(tmp, "run"))
	image := "localhost/causet-projection-worker:image-test"
	const version = "image-test"

	start := time.Now()
	run(ctx, t, root, makeTool, "image", "BINARIES=prebuilt", "RUNTIME_IMAGE=scratch",
		"IMAGE="+image, "VERSION="+version, "BUILDAH_FLAGS="+global)
	t.Logf("make image BINARIES=prebuilt RUNTIME_IMAGE=scratch took %s", time.Since(start).Round(time.Millisecond))

	layout := filepath.Join(tmp, "oci")
	run(ctx, t, root, buildah, append(strings.Fields(global), "push", image, "oci:"+layout)...)
	var index struct {
		Manifests []ociDescriptor `json:"manifests"`
	}
	readJSON(t, filepath.Join(layout, "index.json"), &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(index.Manifests))
	}
	var manifest ociManifest
	readJSON(t, blob(layout, index.Manifests[0]), &manifest)
	var config ociImageConfig
	readJSON(t, blob(layout, manifest.Config), &config)

	c := config.Config
	if c.User != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532 (numeric, so that runAsNonRoot can verify it)", c.User)
	}
	if want := []string{"/usr/local/bin/projection-worker"}; !slices.Equal(c.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", c.Entrypoint, want)
	}
	if want := []string{"run"}; !slices.Equal(c.Cmd, want) {
		t.Errorf("cmd %q, want %q", c.Cmd, want)
	}
	if v := c.Labels["org.opencontainers.image.version"]; v != version {
		t.Errorf("label org.opencontainers.image.version %q, want %q", v, version)
	}

	fs := filepath.Join(tmp, "rootfs")
	for _, l := range manifest.Layers {
		extractLayer(t, blob(layout, l), l.MediaType, fs)
	}
	for _, bin := range []string{"projection-worker", "dlq-replayer"} {
		out := run(ctx, t, tmp, filepath.Join(fs, "usr", "local", "bin", bin), "version")
		if strings.TrimSpace(out) != version {
			t.Errorf("%s version from the image printed %q, want %q", bin, out, version)
		}
	}

	// Every container of the manifests runs a binary of the image as the
	// image's user.
	objs := build(t, "overlays/example")
	for _, name := range []string{"migrate", "replay-retry"} {
		jobs := build(t, "overlays/example/jobs/"+name)
		objs.Jobs = append(objs.Jobs, jobs.Jobs...)
	}
	var pods []podCommand
	for _, d := range objs.Deployments {
		pods = append(pods, commands(d.Name, d.Spec.Template.Spec)...)
	}
	for _, j := range objs.Jobs {
		pods = append(pods, commands(j.Name, j.Spec.Template.Spec)...)
	}
	for _, p := range pods {
		if p.uid == nil || fmt.Sprint(*p.uid)+":"+fmt.Sprint(*p.uid) != c.User {
			t.Errorf("%s runs as user %v, want the image's %s", p.name, p.uid, c.User)
		}
		if len(p.command) == 0 {
			continue // the entrypoint
		}
		if st, err := os.Stat(filepath.Join(fs, p.command[0])); err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s runs %s: not an executable of the image (%v)", p.name, p.command[0], err)
		}
	}
}

// podCommand is what one container of a manifest runs, and as whom.
type podCommand struct {
	name    string   // workload/container
	uid     *int64   // the pod's runAsUser
	command []string // empty: the image's entrypoint
}

// commands returns the podCommand of each container of a pod spec.
func commands(workload string, spec corev1.PodSpec) []podCommand {
	var uid *int64
	if spec.SecurityContext != nil {
		uid = spec.SecurityContext.RunAsUser
	}
	var cs []podCommand
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		cs = append(cs, podCommand{workload + "/" + c.Name, uid, c.Command})
	}
	return cs
}

// run runs name with args in dir and returns its stdout; it fails t with the
// output when the command fails.
func run(ctx context.Context, t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %q: %v\nstdout:\n%s\nstderr:\n%s", name, args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// blob returns the path of a descriptor's blob in an OCI layout.
func blob(layout string, d ociDescriptor) string {
	algo, hex, _ := strings.Cut(d.Digest, ":")
	return filepath.Join(layout, "blobs", algo, hex)
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// extractLayer unpacks a layer tarball (gzip-compressed when its media type
// says so) into dir: directories, regular files with their modes, and
// symbolic links. Whiteouts are ignored: the image's layers only add files.
func extractLayer(t *testing.T, path, mediaType, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(mediaType, "gzip") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("layer %s: %v", path, err)
		}
		name := filepath.Clean("/" + h.Name)
		if strings.HasPrefix(filepath.Base(name), ".wh.") {
			continue
		}
		target := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = writeFile(target, tr, os.FileMode(h.Mode)&0o777)
			}
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = os.Symlink(h.Linkname, target)
			}
		}
		if err != nil {
			t.Fatalf("layer %s: %s: %v", path, h.Name, err)
		}
	}
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
