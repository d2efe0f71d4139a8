"""cluster_test: a Python test driving a real cluster on loopback
(cluster_harness.py): NAME.py gets the kvd binary and make_certs.sh."""

def cluster_test(name, data = [], **kwargs):
    native.sh_test(
        name = name,
        size = "large",
        srcs = [name + ".py"],
        args = [
            "$(location //tools/kvd)",
            "$(location //tools/cluster:make_certs.sh)",
        ],
        data = [
            "cluster_harness.py",
            "//tools/cluster:make_certs.sh",
            "//tools/kvd",
        ] + data,
        **kwargs
    )
