# One primary per shard, spread over the zones round robin (module.layout), each with a gp3 data
# volume, PostgreSQL from Debian's packages configured by cloud-init, and a stable private DNS
# name (shard-007.db.internal) so the shard map is rendered before any instance exists.

locals {
  schema_sql = file(coalesce(var.schema_file, "${path.module}/../local/schema.sql"))
}

resource "aws_instance" "primary" {
  count                  = var.shard_count
  ami                    = data.aws_ami.debian.id
  instance_type          = var.primary_instance_type
  subnet_id              = aws_subnet.primary[index(var.azs, module.layout.shards[count.index].az)].id
  vpc_security_group_ids = [aws_security_group.primary.id]
  iam_instance_profile   = aws_iam_instance_profile.fleet.name
  key_name               = var.key_name
  ebs_optimized          = true

  root_block_device {
    volume_type = "gp3"
    volume_size = 30
  }

  ebs_block_device {
    device_name           = "/dev/sdf"
    delete_on_termination = false
    volume_type           = "gp3"
    volume_size           = var.primary_volume_gb
    iops                  = var.primary_volume_iops
    throughput            = 1000
  }

  metadata_options {
    http_tokens = "required"
  }

  user_data_replace_on_change = false
  user_data = templatefile("${path.module}/templates/primary-init.sh.tftpl", {
    shard_name       = module.layout.shards[count.index].name
    region           = var.region
    postgres_version = var.postgres_version
    database         = var.database
    backend_password = var.backend_password
    vpc_cidr         = var.vpc_cidr
    huge_pages       = module.config.huge_pages
    conf_b64         = base64encode(module.config.postgresql_conf)
    schema_b64       = base64encode(local.schema_sql)
  })

  tags = { Name = "${var.name}-${module.layout.shards[count.index].name}", Role = "primary" }

  # A newer AMI or a changed postgresql.conf must never replace (or restart) a primary: cloud-init
  # runs once, so change a running primary's configuration on the instance itself.
  lifecycle {
    ignore_changes = [ami, user_data]
  }

  # Packages and S3 need the NAT route and the role's policy at first boot.
  depends_on = [
    aws_route_table_association.primary,
    aws_vpc_endpoint.s3,
    aws_iam_role_policy.fleet,
    aws_iam_role_policy_attachment.ssm,
  ]
}

resource "aws_route53_zone" "db" {
  name = "db.internal"
  vpc {
    vpc_id = local.vpc_id
  }
}

resource "aws_route53_record" "primary" {
  count   = var.shard_count
  zone_id = aws_route53_zone.db.zone_id
  name    = module.layout.shards[count.index].dns
  type    = "A"
  ttl     = 60
  records = [aws_instance.primary[count.index].private_ip]
}
