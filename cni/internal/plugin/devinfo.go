package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DeviceInfoVersion is the NPWG Device Information Specification version written.
const DeviceInfoVersion = "1.1.0"

// DeviceInfo is an NPWG device-info record (Device Information Specification 1.1.0, type
// "memif": the closest kind to a DockPipe, shared-memory rings found through a socket).
type DeviceInfo struct {
	Type    string     `json:"type"`
	Version string     `json:"version"`
	Memif   *MemifInfo `json:"memif,omitempty"`
}

// MemifInfo is the "memif" map of a device-info record.
type MemifInfo struct {
	// Role "slave": the host (the daemon) creates the socket and the application in the
	// container connects to it, in the spec's words.
	Role string `json:"role"`
	// Path of the socket: an abstract name ("@docknet/pipe") in the pod's network namespace.
	Path string `json:"path"`
	// Mode "ethernet": the pipe carries Ethernet frames.
	Mode string `json:"mode"`
}

// validDevInfoName: a plain file name, not hidden.
func validDevInfoName(s string) bool {
	return charset(s, 1, 255, "_.-", false) && s[0] != '.' && s[0] != '-'
}

// DeviceInfoPath picks where the record of an attachment goes: the runtime's
// CNIDeviceInfoFile (Multus names one per attachment) if it lies directly in the configured
// directory or the spec's, else `DIR/NETWORK-CONTAINERID-IFNAME-device.json`.
func DeviceInfoPath(conf *NetConf, containerID, ifName string) (string, error) {
	if conf.RuntimeConfig != nil && conf.RuntimeConfig.DeviceInfoFile != "" {
		p := conf.RuntimeConfig.DeviceInfoFile
		dir, base := filepath.Dir(p), filepath.Base(p)
		if filepath.Clean(p) != p || (dir != conf.DeviceInfoDir && dir != DefaultDeviceInfoDir) || !validDevInfoName(base) {
			return "", configErr("runtimeConfig.CNIDeviceInfoFile %q must be a file directly in %s", p, conf.DeviceInfoDir)
		}
		return p, nil
	}
	base := fmt.Sprintf("%s-%s-%s-device.json", conf.Name, containerID, ifName)
	if !validDevInfoName(base) {
		return "", configErr("cannot name a device-info file %q", base)
	}
	return filepath.Join(conf.DeviceInfoDir, base), nil
}

// openDir opens an existing directory without following a link in its last component.
func openDir(dir string) (int, error) {
	return unix.Open(dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// WriteDeviceInfo writes rec at path atomically (a new file in the same directory, renamed
// over the name); the directory is created if missing (0755, as the spec asks), and no link
// is followed in the file's own name.
func WriteDeviceInfo(path string, rec *DeviceInfo) error {
	body, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	dir, base := filepath.Dir(path), filepath.Base(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("device-info directory %s: %w", dir, err)
	}
	dfd, err := openDir(dir)
	if err != nil {
		return fmt.Errorf("device-info directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	tmp := fmt.Sprintf(".%s.%d.tmp", base, os.Getpid())
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("device-info file %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(body)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, base)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("device-info file %s: %w", path, werr)
	}
	return nil
}

// RemoveDeviceInfo removes the record at path; a missing file or directory is not an error.
func RemoveDeviceInfo(path string) error {
	dfd, err := openDir(filepath.Dir(path))
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("device-info directory of %s: %w", path, err)
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, filepath.Base(path), 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing device-info file %s: %w", path, err)
	}
	return nil
}
