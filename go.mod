module nvpair-workload-manager

go 1.26
