package daemon

import (
	"strings"
	"testing"
)

func TestAdminSocketAccess(t *testing.T) {
	t.Parallel()
	t.Run("without an admin group: root only, mode 0600", func(t *testing.T) {
		callers, opts, err := adminSocketAccess("")
		if err != nil || callers.HasGroup || opts.Mode != 0o600 || opts.Group != "" {
			t.Errorf("callers %v, options %+v, err %v", callers, opts, err)
		}
	})
	t.Run("with an admin group: root and that group, mode 0660 of that group", func(t *testing.T) {
		callers, opts, err := adminSocketAccess("4242")
		if err != nil || !callers.HasGroup || callers.Group != 4242 || opts.Mode != 0o660 || opts.Group != "4242" {
			t.Errorf("callers %v, options %+v, err %v", callers, opts, err)
		}
	})
	t.Run("an unknown group is refused naming the field", func(t *testing.T) {
		_, _, err := adminSocketAccess("no-such-group-for-cri-image-proxy")
		if err == nil || !strings.Contains(err.Error(), "ensureSecretPulledImages.adminGroup") {
			t.Errorf("got %v", err)
		}
	})
}
