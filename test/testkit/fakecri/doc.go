// Package fakecri is the one fake CRI v1 runtime of the tests that need a
// runtime behind a socket (the proxy's, the daemon's): a Runtime holds the
// images a test put, counts the calls it is made, and is served on a unix
// socket (Serve) or on a listener of the test's own (Server), in the test's
// process or in a child.
//
// What it answers:
//   - Version: its name as RuntimeName, Version 0.1.0, RuntimeVersion 1.0,
//     RuntimeApiVersion v1. Status: the runtime and the network ready.
//   - ImageStatus, ListImages, RemoveImage: its images. A name is an
//     image's ID, or one of its tags or digests, exactly as written: no
//     normalization, no ID prefix (ensure's tests, which need containerd's
//     reference rules, have a fake node of their own). An absent image is
//     an empty answer; removing one succeeds, as the CRI's RemoveImage is
//     idempotent; ListImages ignores its filter, as containerd does, and
//     lists by ID.
//   - PullImage: the registry has every image. A name the runtime holds
//     answers that image's ID; any other is held from then on as a new
//     image, ID sha256:pulled-NAME, so that a test reads in the answer
//     which name reached the runtime. A hook set with BeforePull runs
//     first, and its error is the answer.
//   - CreateContainer: the container ctr-IMAGE. ImageFsInfo and
//     RemovePodSandbox: an empty answer.
//   - GetContainerEvents: three events (containers c0, c1, c2), then the
//     stream ends with Aborted, "events end here": messages and then a
//     status, each of which a proxy must pass on.
//   - Any method of any service it does not know, of any kind: each
//     message sent back as it came, undecoded, as a newer runtime serves
//     methods a build has never seen. A CRI method it does not answer is
//     Unimplemented.
//
// Every call, before it is answered, is counted (Calls), its content-type
// noted (ContentTypes), and what it brought sent back as headers:
// x-seen-test (the call's x-test metadata), x-seen-content-type, and
// x-seen-deadline-ms (the time left to its deadline, if it has one), with
// the trailer x-trailer: from-runtime. Then an error set with Fail for its
// method is its answer. Methods are named as the CRI's by their name alone
// (PullImage), any other by its full name (/future.v9.Thing/Chat).
//
// It is for tests only, as package testkit: no product code imports it.
package fakecri
