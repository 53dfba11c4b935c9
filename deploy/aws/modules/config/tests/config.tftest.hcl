# The rendered files for an r8g.16xlarge primary and the defaults: sizes from the instance's
# memory and vCPUs, the budget's max_connections, the router's ports and drain timing.

variables {
  max_connections  = 4466
  app_password     = "app-secret"
  admin_password   = "admin-secret"
  backend_password = "backend-secret"
}

run "an_r8g_16xlarge_primary" {
  command = plan

  assert {
    condition     = output.shared_buffers_mb == 131072
    error_message = "shared_buffers must be a quarter of 512 GiB"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "shared_buffers = '131072MB'")
    error_message = "postgresql.conf must carry shared_buffers"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "effective_cache_size = '393216MB'")
    error_message = "effective_cache_size must be three quarters of RAM"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "max_connections = 4466")
    error_message = "max_connections must come from the budget"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "maintenance_work_mem = '2048MB'")
    error_message = "maintenance_work_mem is capped at 2 GB"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "max_worker_processes = 64") && strcontains(output.postgresql_conf, "wal_level = logical")
    error_message = "workers from vCPUs, and logical WAL for splits"
  }
  assert {
    condition     = output.huge_pages == 68813
    error_message = "huge pages: shared_buffers + 5% in 2 MiB pages"
  }
  assert {
    condition     = !strcontains(output.postgresql_conf, "$${") && !strcontains(output.postgresql_conf, "%%{")
    error_message = "every template variable is filled"
  }
}

run "the_router_config" {
  command = plan

  assert {
    condition     = strcontains(nonsensitive(output.router_toml), "listen = \"0.0.0.0:6432\"") && strcontains(nonsensitive(output.router_toml), "listen = \"0.0.0.0:9930\"")
    error_message = "clients on 6432, the HTTP side port on 9930"
  }
  assert {
    condition     = strcontains(nonsensitive(output.router_toml), "drain_timeout_ms = 30000") && output.deregistration_delay_s == 30
    error_message = "the NLB's deregistration delay is the drain timeout"
  }
  assert {
    condition     = strcontains(nonsensitive(output.router_toml), "password = \"backend-secret\"")
    error_message = "the backend login is rendered"
  }
}

run "a_small_primary" {
  command = plan

  variables {
    primary_memory_gib = 16
    primary_vcpus      = 4
    max_connections    = 200
  }

  assert {
    condition     = strcontains(output.postgresql_conf, "shared_buffers = '4096MB'") && strcontains(output.postgresql_conf, "work_mem = '15MB'")
    error_message = "a 16 GiB primary: 4 GB shared_buffers, work_mem from what is left per connection"
  }
  assert {
    condition     = strcontains(output.postgresql_conf, "max_worker_processes = 8") && strcontains(output.postgresql_conf, "max_parallel_workers = 2")
    error_message = "at least 8 worker processes and 2 parallel workers"
  }
}

run "refuses_a_bad_huge_pages" {
  command = plan

  variables {
    huge_pages = "maybe"
  }

  expect_failures = [var.huge_pages]
}
