# Offline: the module has no provider, so `terraform init && terraform test` needs no network.

variables {
  azs = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

run "the_record_layout" {
  command = plan

  assert {
    condition     = length(output.shards) == 512
    error_message = "512 shards by default"
  }
  assert {
    condition     = output.shards[7].name == "shard-007" && output.shards[7].dns == "shard-007.db.internal"
    error_message = "shard names are zero-padded to three digits in the private zone"
  }
  assert {
    condition     = output.shards[0].az == "us-east-1a" && output.shards[4].az == "us-east-1b" && output.shards[511].az == "us-east-1b"
    error_message = "shards go round robin over the AZs"
  }
  assert {
    condition     = length([for s in output.shards : s if s.az == "us-east-1c"]) == 170
    error_message = "512 shards over 3 AZs: 171, 171, 170"
  }
  assert {
    condition     = output.primary_subnets == ["10.40.0.0/20", "10.40.16.0/20", "10.40.32.0/20"] && output.client_subnets[0] == "10.40.48.0/20"
    error_message = "one /20 per AZ for primaries, then one per AZ for clients"
  }
  assert {
    condition     = output.backend_connections_per_primary == 138 * 32 && output.max_connections == 138 * 32 + 50
    error_message = "per-thread pools: routers x workers connections per primary, plus the reserve"
  }
  assert {
    condition     = output.primary_url_template == "postgres://shard-{index:3}.db.internal:5432/shard"
    error_message = "the shard map template names the private DNS names"
  }
}

run "a_small_fleet" {
  command = plan
  variables {
    shard_count  = 5
    azs          = ["eu-west-1a"]
    router_count = 2
    dns_zone     = "shards.example.internal"
  }
  assert {
    condition     = length(output.shards) == 5 && alltrue([for s in output.shards : s.az == "eu-west-1a"])
    error_message = "one AZ takes every shard"
  }
  assert {
    condition     = output.shards[4].dns == "shard-004.shards.example.internal"
    error_message = "the zone is part of every name"
  }
}

run "too_many_shards_are_refused" {
  command = plan
  variables {
    shard_count = 5000
  }
  expect_failures = [var.shard_count]
}

run "a_repeated_az_is_refused" {
  command = plan
  variables {
    azs = ["us-east-1a", "us-east-1a"]
  }
  expect_failures = [var.azs]
}

run "a_bad_cidr_is_refused" {
  command = plan
  variables {
    vpc_cidr = "10.40.0.0/33"
  }
  expect_failures = [var.vpc_cidr]
}
