module github.com/nvidia-pair/nvpair-workload-manager/clients/go

go 1.26
