// Package execplugin runs an exec plugin once, bounded, for the proxy's two
// kinds of plugins (credential providers and image policy providers): the
// request on stdin, the answer on stdout, diagnostics on stderr.
//
// Contract:
//   - The plugin runs with args and env from its configuration, appended
//     after the host's environment so that the configuration's variables
//     win (kubernetes/kubernetes#102750), in a process group of its own.
//   - A timeout (Command.Timeout, DefaultTimeout when 0) or the caller's
//     context kills the whole process group, children included.
//   - stdout is bounded (MaxStdout, 1 MiB by default): past it the plugin
//     is killed and the run fails with ErrOutputLimit; stderr is kept up
//     to MaxStderr (64 KiB) and never fails the run.
//   - Errors name the plugin and wrap ErrTimeout, ErrOutputLimit or
//     ErrFailed (a non-zero exit, a signal, an executable that cannot be
//     started). They never quote stdout, which may hold credentials.
//   - ForLog prepares stderr for a debug log line: capped, with the known
//     secrets and anything shaped like a token or an auth header masked.
package execplugin
