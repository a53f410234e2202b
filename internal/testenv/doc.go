// Package testenv starts the real parts Krane's tests run against: a private
// MySQL-compatible server and a Restate server, and (in subpackage kubeenv) a
// Kubernetes control plane with simulated nodes. Nothing here is a mock.
//
// Each test package shares one instance of each part, started on first use and
// stopped when the package's tests end; call [Main] from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// A test of replication starts MySQL servers of its own, with a binary log,
// through [StartReplicableMySQL].
//
// Every process dies with the test binary (Pdeathsig), logs to a file under
// the package's work directory (kept, and its path printed, when a test
// fails), and a part that cannot start names the missing binary and the make
// target that provides it. Binaries come from `make testenv`, which builds or
// installs them into a cache outside the checkout (see [CacheDir]).
package testenv
