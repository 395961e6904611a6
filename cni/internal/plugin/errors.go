package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"docknet/cni/internal/daemon"
)

// ErrPluginNotAvailable is the spec's code 50: the plugin cannot serve ADD (STATUS).
const ErrPluginNotAvailable uint = 50

// DockNet's own error codes (the CNI spec leaves codes from 100 to plugins).
const (
	// ErrDaemon: the daemon refused a request for a reason of its own (its message says why).
	ErrDaemon uint = 100
	// ErrAddressInUse: the address IPAM gave is already another pipe's.
	ErrAddressInUse uint = 101
	// ErrPipeExists: the container already has a pipe this attachment did not make.
	ErrPipeExists uint = 102
	// ErrNoPipe: CHECK found no pipe for the attachment.
	ErrNoPipe uint = 103
	// ErrMismatch: CHECK found the pipe differing from the result or the configuration.
	ErrMismatch uint = 104
	// ErrFastChannel: a fast channel the pod asked for could not be built.
	ErrFastChannel uint = 105
	// ErrDeviceInfo: the device-info file could not be written.
	ErrDeviceInfo uint = 106
	// ErrNoIPv4: IPAM gave no IPv4 address (DockNet forwards IPv4 only).
	ErrNoIPv4 uint = 107
)

// codeError carries a DockNet code through the plugin's functions.
type codeError struct {
	code uint
	msg  string
}

func (e *codeError) Error() string { return e.msg }

func newErr(code uint, format string, a ...any) error {
	return &codeError{code: code, msg: fmt.Sprintf(format, a...)}
}

// ToCNI turns any error of the plugin into CNI error JSON with its code: the spec's codes for
// configuration (7), environment (4) and a daemon that does not answer (11: try again later),
// DockNet's from 100, and an IPAM plugin's error as that plugin gave it.
func ToCNI(err error) *types.Error {
	if err == nil {
		return nil
	}
	var (
		te   *types.Error
		ce   *ConfigError
		ee   *EnvError
		ue   *daemon.UnavailableError
		ae   *daemon.APIError
		code *codeError
	)
	switch {
	case errors.As(err, &te):
		return te
	case errors.As(err, &ce):
		return types.NewError(types.ErrInvalidNetworkConfig, ce.Error(), "")
	case errors.As(err, &ee):
		return types.NewError(types.ErrInvalidEnvironmentVariables, ee.Error(), "")
	case errors.As(err, &ue):
		return types.NewError(types.ErrTryAgainLater, err.Error(), "the daemon may be restarting; try again later")
	case errors.As(err, &code):
		return types.NewError(code.code, err.Error(), "")
	case errors.As(err, &ae):
		switch ae.Code {
		case daemon.CodeIPInUse:
			return types.NewError(ErrAddressInUse, err.Error(), "")
		case daemon.CodeExists:
			return types.NewError(ErrPipeExists, err.Error(), "")
		case daemon.CodeBadParams, daemon.CodeBadIP:
			return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		case daemon.CodeBadName:
			return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
		case daemon.CodeBusy:
			return types.NewError(types.ErrTryAgainLater, err.Error(), "")
		}
		return types.NewError(ErrDaemon, err.Error(), "daemon error code "+ae.Code)
	}
	return types.NewError(ErrDaemon, err.Error(), "")
}
