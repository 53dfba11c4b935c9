# Load generators: loadgen installed and the shard map fetched at boot; `scripts/scale-run.sh`
# starts the run on all of them at one agreed time (through SSM), they upload their JSON reports
# to S3, and the script merges them into the fleet's report and chart.

resource "aws_instance" "loadgen" {
  count                  = var.loadgen_count
  ami                    = data.aws_ami.debian.id
  instance_type          = var.loadgen_instance_type
  subnet_id              = aws_subnet.client[count.index % length(var.azs)].id
  vpc_security_group_ids = [aws_security_group.loadgen.id]
  iam_instance_profile   = aws_iam_instance_profile.fleet.name
  key_name               = var.key_name

  metadata_options {
    http_tokens = "required"
  }

  user_data = templatefile("${path.module}/templates/loadgen-init.sh.tftpl", {
    index            = count.index
    region           = var.region
    artifact_uri     = local.artifact_uri
    shardmap_uri     = local.shardmap_uri
    reports_uri      = local.reports_uri
    target           = "postgres://app:${var.app_password}@${aws_lb.routers.dns_name}:6432/${var.database}"
    backend_user     = "shardgate"
    backend_password = var.backend_password
  })

  tags = { Name = "${var.name}-loadgen-${count.index}", Role = "loadgen" }

  lifecycle {
    ignore_changes = [ami, user_data]
  }

  depends_on = [
    aws_route_table_association.client,
    aws_vpc_endpoint.s3,
    aws_iam_role_policy.fleet,
    aws_iam_role_policy_attachment.ssm,
  ]
}
