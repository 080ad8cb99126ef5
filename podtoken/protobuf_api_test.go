package podtoken

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// fakeProtobufAPI answers as the API server does to a client that prefers
// protobuf: objects and Status errors in protobuf (with its magic prefix),
// watches as length-delimited raw WatchEvents whose objects are full
// protobuf.
func fakeProtobufAPI(t *testing.T) *httptest.Server {
	scheme := runtime.NewScheme()
	corev1.AddToScheme(scheme)
	authenticationv1.AddToScheme(scheme)
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	pb := protobuf.NewSerializer(scheme, scheme)
	raw := protobuf.NewRawSerializer(scheme, scheme)
	encode := func(obj runtime.Object, gvk schema.GroupVersionKind) []byte {
		obj.GetObjectKind().SetGroupVersionKind(gvk)
		var b bytes.Buffer
		if err := pb.Encode(obj, &b); err != nil {
			t.Error(err)
		}
		return b.Bytes()
	}
	podGVK := corev1.SchemeGroupVersion.WithKind("Pod")
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "2"},
			Spec: corev1.PodSpec{NodeName: "node", ServiceAccountName: "sa", ImagePullSecrets: []corev1.LocalObjectReference{{Name: "a\x00b"}, {Name: "\xff"}}}}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Accept"), "application/vnd.kubernetes.protobuf") {
			t.Errorf("%s %s: Accept %q", r.Method, r.URL, r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		switch {
		case r.URL.Path == "/api/v1/namespaces/ns/secrets/gone":
			w.WriteHeader(http.StatusNotFound)
			st := &apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "gone").ErrStatus
			w.Write(encode(st, schema.GroupVersionKind{Version: "v1", Kind: "Status"}))
		case r.URL.Path == "/api/v1/namespaces/ns/pods/p":
			w.Write(encode(pod("p"), podGVK))
		case r.URL.Path == "/api/v1/namespaces/ns/serviceaccounts/sa/token":
			if ct := r.Header.Get("Content-Type"); ct != "application/vnd.kubernetes.protobuf" {
				t.Errorf("TokenRequest sent as %q", ct)
			}
			body, _ := io.ReadAll(r.Body)
			obj, _, err := pb.Decode(body, nil, nil)
			if err != nil {
				t.Errorf("TokenRequest body: %v", err)
				return
			}
			tr := obj.(*authenticationv1.TokenRequest)
			tr.Status.Token = "tok-" + tr.Spec.BoundObjectRef.Name
			tr.Status.ExpirationTimestamp = metav1.NewTime(time.Unix(2_000_000_000, 0))
			w.Write(encode(tr, authenticationv1.SchemeGroupVersion.WithKind("TokenRequest")))
		case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "true":
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf;stream=watch")
			w.WriteHeader(http.StatusOK)
			for _, ev := range []struct {
				typ string
				obj []byte
			}{
				{string(watch.Added), encode(pod("w"), podGVK)},
				{string(watch.Error), encode(&apierrors.NewResourceExpired("too old").ErrStatus, schema.GroupVersionKind{Version: "v1", Kind: "Status"})},
			} {
				var b bytes.Buffer
				if err := raw.Encode(&metav1.WatchEvent{Type: ev.typ, Object: runtime.RawExtension{Raw: ev.obj}}, &b); err != nil {
					t.Error(err)
				}
				var n [4]byte
				n[0], n[1], n[2], n[3] = byte(b.Len()>>24), byte(b.Len()>>16), byte(b.Len()>>8), byte(b.Len())
				w.Write(n[:])
				w.Write(b.Bytes())
			}
		case r.URL.Path == "/api/v1/pods":
			l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "3"}, Items: []corev1.Pod{*pod("l")}}
			w.Write(encode(l, corev1.SchemeGroupVersion.WithKind("PodList")))
		default:
			w.WriteHeader(http.StatusTeapot)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTheAPIIsReadAndWrittenInProtobuf: with protobuf asked for, every call
// of the API still reads what JSON gave: a deleted secret is NotFound (the
// Status error decodes, so the secret is cached and entitles nobody), a
// pod's pull secret names come back byte for byte (no UTF-8 repair), a
// list, a watch's events and its ERROR event (a Status), and a
// TokenRequest sent as protobuf.
func TestTheAPIIsReadAndWrittenInProtobuf(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api, err := NewAPI(&rest.Config{Host: fakeProtobufAPI(t).URL})
	if err != nil {
		t.Fatal(err)
	}
	s := New(api, "node", Options{})
	if _, err := s.Secret(ctx, "ns", "gone"); !apierrors.IsNotFound(err) {
		t.Errorf("a deleted secret: %v, want NotFound", err)
	}
	p, err := s.Pod(ctx, "ns", "p", "uid-p")
	if err != nil || p.Spec.ImagePullSecrets[0].Name != "a\x00b" || p.Spec.ImagePullSecrets[1].Name != "\xff" {
		t.Errorf("GET pod: %v %+v", err, p)
	}
	l, err := api.ListPods(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node"})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "l" || l.ResourceVersion != "3" {
		t.Errorf("list: %v %+v", err, l)
	}
	w, err := api.WatchPods(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := <-w.ResultChan()
	if got, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || got.Name != "w" {
		t.Errorf("first watch event: %v %#v", ev.Type, ev.Object)
	}
	ev = <-w.ResultChan()
	if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || !apierrors.IsResourceExpired(apierrors.FromObject(st)) {
		t.Errorf("error watch event: %v %#v", ev.Type, ev.Object)
	}
	tok, err := s.Token(ctx, p, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sa", UID: "sa-uid"}}, "aud")
	if err != nil || tok != "tok-p" {
		t.Errorf("token: %q %v", tok, err)
	}
}
