package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// file is one regular file of an image layer: where it goes and where its bytes come from.
type file struct {
	dst  string // path inside the image, absolute
	src  string // path on the host
	mode int64
}

// sharedLibs lists what `ldd bin` says bin loads (the loader included), so a dynamically
// linked program runs in a rootfs that has nothing else.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// layerTar builds an uncompressed layer: the directories each file needs, then the files
// (their contents, links resolved).
func layerTar(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{"/tmp": true, "/proc": true, "/sys": true, "/dev": true, "/etc": true}
	for _, f := range files {
		for d := filepath.Dir(f.dst); d != "/"; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.dst, "/"), Mode: f.mode, Size: int64(len(data))}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// ociArchive builds an OCI image layout as a tar (what `ctr images import` reads): one
// linux/amd64 image called name with one layer and cmd as its command.
func ociArchive(name string, layer []byte, cmd []string) ([]byte, error) {
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Cmd": cmd, "Env": []string{"PATH=/"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": len(layer)}},
	})
	if err != nil {
		return nil, err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    digest(manifest), "size": len(manifest),
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:]},
		}},
	})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(n string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755}); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755}); err != nil {
		return nil, err
	}
	for _, b := range [][]byte{config, manifest, layer} {
		if err := add("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b); err != nil {
			return nil, err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := add("index.json", index); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
