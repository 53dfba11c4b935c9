# The files every fleet member is configured with, rendered from deploy/aws/templates for the
# instance sizes and the connection budget: a shard primary's postgresql.conf (memory and CPU
# settings from the instance type) and a router's router.toml. No provider and no resource, so
# `terraform init`, `validate` and `test` run offline; the root module passes the results to
# cloud-init. benches/tests/terraform.rs also renders the templates itself and checks them with
# `shardgate --check` and a real Postgres.

terraform {
  required_version = ">= 1.6"
}

locals {
  memory_mb = floor(var.primary_memory_gib * 1024)

  # A quarter of RAM for shared_buffers, three quarters as the planner's page cache estimate,
  # maintenance_work_mem at 1/64 (at most 2 GB), work_mem what is left per connection and sort.
  shared_buffers_mb       = floor(local.memory_mb / 4)
  effective_cache_size_mb = floor(local.memory_mb * 3 / 4)
  maintenance_work_mem_mb = min(2048, max(64, floor(local.memory_mb / 64)))
  work_mem_mb             = max(4, min(64, floor((local.memory_mb - local.shared_buffers_mb) / (var.max_connections * 4))))
  # Huge pages for shared_buffers plus 5% for the rest of shared memory, 2 MiB each.
  huge_pages_count = ceil(local.shared_buffers_mb * 1.05 / 2)

  postgresql_conf = templatefile("${path.module}/../../templates/postgresql.conf.tftpl", {
    port                   = var.postgres_port
    max_connections        = var.max_connections
    shared_buffers         = "${local.shared_buffers_mb}MB"
    huge_pages             = var.huge_pages
    effective_cache_size   = "${local.effective_cache_size_mb}MB"
    work_mem               = "${local.work_mem_mb}MB"
    maintenance_work_mem   = "${local.maintenance_work_mem_mb}MB"
    max_worker_processes   = max(8, var.primary_vcpus)
    max_parallel_workers   = max(2, floor(var.primary_vcpus / 2))
    max_slot_wal_keep_size = "${var.max_slot_wal_keep_size_gb}GB"
    max_wal_size           = "${var.max_wal_size_gb}GB"
  })

  router_toml = templatefile("${path.module}/../../templates/router.toml.tftpl", {
    router_port        = var.router_port
    http_port          = var.http_port
    database           = var.database
    app_user           = var.app_user
    app_password       = var.app_password
    admin_user         = var.admin_user
    admin_password     = var.admin_password
    backend_user       = var.backend_user
    backend_password   = var.backend_password
    pool_max_size      = var.pool_max_size
    shared_connections = var.shared_connections
    pause_timeout_ms   = var.pause_timeout_ms
    max_clients        = var.max_clients
    drain_grace_ms     = var.drain_grace_ms
    drain_timeout_ms   = var.drain_timeout_ms
  })
}
