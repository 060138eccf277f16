module github.com/nvidia-pair/nvpair-workload-manager/examples/producer

go 1.26

require github.com/nvidia-pair/nvpair-workload-manager/clients/go v0.0.0

// Until the repository is published, the client is taken from this checkout.
replace github.com/nvidia-pair/nvpair-workload-manager/clients/go => ../../clients/go
