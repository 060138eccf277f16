<#
.SYNOPSIS
Installs nvpair-workload-manager on a Windows PAIR node, checks it, and
rolls it back. Linux and macOS: scripts/install.sh, which this mirrors.

.DESCRIPTION
  powershell -ExecutionPolicy Bypass -File scripts\install.ps1 install NEW.exe   replace the running worker, check, roll back on failure
  powershell -ExecutionPolicy Bypass -File scripts\install.ps1 check             post a check job through the ingress and close it
  powershell -ExecutionPolicy Bypass -File scripts\install.ps1 rollback          put the stock executable back and restart the worker

PAIR's back end (the broker) runs the worker as
  nvpair-workload-manager.exe --log-level LEVEL --cluster-dir APP-DIR\cluster
and starts it again when it exits. This script finds that process by its
--cluster-dir, takes its executable's path from the process, keeps the stock
executable beside it as EXE.stock (once: an existing backup is never
overwritten), puts the new one in its place and stops the worker so the
broker starts the new one. Windows does not let a running executable be
overwritten, but it lets it be renamed: the running one is renamed aside
(EXE.replaced), the new one renamed into place, and the aside copy removed
once the worker has stopped. It exits 0 only when the check passed; when the
check fails it puts the stock executable back, restarts the worker and exits 1.

.PARAMETER AppDir
PAIR's app dir (default: %LOCALAPPDATA%\Nvidia Corporation\NVIDIA PAIR, as the daemon finds it).

.PARAMETER Listen
The ingress address written to workload-ingress.json when that file does not
exist yet (default 127.0.0.1:14324).

.PARAMETER Timeout
How long to wait for the restarted worker, in seconds (default 60).
#>
[CmdletBinding()]
param(
    [Parameter(Position = 0, Mandatory = $true)]
    [ValidateSet('install', 'check', 'rollback')]
    [string]$Command,
    [Parameter(Position = 1)]
    [string]$NewExecutable,
    [string]$AppDir,
    [string]$Listen,
    [ValidateRange(1, 3600)]
    [int]$Timeout = 60
)

Set-StrictMode -Version 2.0
$ErrorActionPreference = 'Stop'
$ListenDefault = '127.0.0.1:14324'
$Prog = 'install.ps1'

function Say([string]$Text) { Write-Host "${Prog}: $Text" }
function Die([string]$Text) {
    [Console]::Error.WriteLine("${Prog}: $Text")
    exit 1
}

if (-not $AppDir) {
    $AppDir = Join-Path $env:LOCALAPPDATA 'Nvidia Corporation\NVIDIA PAIR'
}
if (-not (Test-Path -LiteralPath $AppDir -PathType Container)) {
    Die "no PAIR app dir at $AppDir (is PAIR installed for this user? else give -AppDir)"
}
$ClusterDir = Join-Path $AppDir 'cluster'
# Record holds the path of the executable install replaced, for a rollback
# when no worker runs from it.
$Record = Join-Path $AppDir 'nvpair-workload-manager.installed-at'

# Get-WorkerIds returns the id of every process whose command line passes
# --cluster-dir with this node's cluster dir: the worker the broker runs.
function Get-WorkerIds {
    $ids = @()
    foreach ($p in @(Get-CimInstance Win32_Process)) {
        $line = $p.CommandLine
        if (-not $line -or $p.ProcessId -eq $PID) { continue }
        foreach ($form in @("--cluster-dir $ClusterDir", "--cluster-dir `"$ClusterDir`"", "--cluster-dir=$ClusterDir", "`"--cluster-dir=$ClusterDir`"")) {
            $i = $line.IndexOf($form, [StringComparison]::OrdinalIgnoreCase)
            if ($i -lt 0) { continue }
            $after = $i + $form.Length
            if ($after -eq $line.Length -or $line[$after] -eq ' ') {
                $ids += [int]$p.ProcessId
                break
            }
        }
    }
    return , $ids
}

# Get-WorkerId returns the id of the one worker proven to be PAIR's
# workload manager (Test-Wlm), or $null when no process passes the
# --cluster-dir. When some do but none or several is proven it stops,
# saying why in one line, having changed nothing (-Quiet: returns $null
# instead). Any process of this user can pass --cluster-dir; one that is
# not proven is never acted on.
function Get-WorkerId([switch]$Quiet) {
    $ids = Get-WorkerIds
    if ($ids.Count -eq 0) { return $null }
    $proven = @()
    $why = ''
    foreach ($id in $ids) {
        $r = Test-Wlm $id
        if ($null -eq $r) { $proven += $id } else { $why = $r }
    }
    if ($proven.Count -eq 1) { return $proven[0] }
    if ($Quiet) { return $null }
    if ($proven.Count -eq 0) { Die "$why; nothing changed" }
    Die "several workload managers run with --cluster-dir ${ClusterDir}: $($proven -join ' '); nothing changed"
}

# Test-Wlm returns $null when the process is PAIR's workload manager: its
# executable answers --version as this project does ("nvpair-workload-manager
# VERSION GO OS/ARCH"), or with one word, as the stock build prints its bare
# version, while its parent is PAIR's broker (nvpair-ui-broker). Otherwise
# it returns why not.
function Test-Wlm([int]$Id) {
    $exe = Get-ExeOf $Id
    if (-not $exe) { return "process $Id passes --cluster-dir $ClusterDir, but its executable cannot be resolved" }
    $v = Get-VersionOf $exe
    if ($v.StartsWith('nvpair-workload-manager ')) { return $null }
    $parent = Get-ParentName $Id
    if ($v -match '^[A-Za-z0-9._+-]+$' -and $parent -eq 'nvpair-ui-broker') { return $null }
    if ($v.Length -gt 80) { $v = $v.Substring(0, 80) }
    return "process $Id passes --cluster-dir $ClusterDir but is not PAIR's workload manager: $exe --version answers `"$v`", and its parent ($parent) is not PAIR's broker"
}

# Get-VersionOf returns the first line Exe --version prints within 5 s, or
# '': a stand-in that hangs must not hang the script.
function Get-VersionOf([string]$Exe) {
    $out = [IO.Path]::GetTempFileName()
    $err = [IO.Path]::GetTempFileName()
    try {
        $p = Start-Process -FilePath $Exe -ArgumentList '--version' -NoNewWindow -PassThru -RedirectStandardOutput $out -RedirectStandardError $err -ErrorAction Stop
        if (-not $p.WaitForExit(5000)) {
            Stop-Process -Id $p.Id -Force -ErrorAction SilentlyContinue
            return ''
        }
        $line = Get-Content -LiteralPath $out -TotalCount 1
        if ($null -eq $line) { return '' }
        return "$line".Trim()
    } catch {
        return ''
    } finally {
        Remove-Item -LiteralPath $out, $err -Force -ErrorAction SilentlyContinue
    }
}

# Get-ParentName returns the process name of the process's parent (the
# broker runs the worker), or ''.
function Get-ParentName([int]$Id) {
    $c = Get-CimInstance Win32_Process -Filter "ProcessId=$Id" -ErrorAction SilentlyContinue
    if (-not $c) { return '' }
    $pp = Get-Process -Id $c.ParentProcessId -ErrorAction SilentlyContinue
    if (-not $pp) { return '' }
    return $pp.ProcessName
}

# Get-ExeOf returns the full path of the process's executable.
function Get-ExeOf([int]$Id) {
    $p = Get-Process -Id $Id -ErrorAction SilentlyContinue
    if (-not $p -or -not $p.Path) { return $null }
    return [IO.Path]::GetFullPath($p.Path)
}

# Stop-Worker stops the worker and waits until it has exited: the broker
# then starts the executable anew.
function Stop-Worker([int]$Id) {
    $p = Get-Process -Id $Id -ErrorAction SilentlyContinue
    if (-not $p) { return }
    Stop-Process -Id $Id -Force -ErrorAction SilentlyContinue
    if (-not $p.WaitForExit(20000)) { Die "worker $Id did not exit" }
}

# Wait-Restarted waits until the broker runs a new worker from Exe and
# returns its id, or $null after the timeout.
function Wait-Restarted([int]$OldId, [string]$Exe) {
    $end = (Get-Date).AddSeconds($Timeout)
    while ((Get-Date) -le $end) {
        # A process running the file just installed (or put back) is the
        # worker: the script knows what that file is.
        $ids = Get-WorkerIds
        foreach ($id in $ids) {
            if ($id -ne $OldId -and (Get-ExeOf $id) -eq $Exe) { return $id }
        }
        Start-Sleep -Milliseconds 200
    }
    return $null
}

# Get-NodeId returns this node's id as the daemon resolves it: the cluster
# manager's cluster\identity.json when it exists, else node-id.json in the
# app dir, else the bare node-id file of earlier versions. A file that
# exists but names no UUID is an error, as it is for the daemon.
$UuidPattern = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
function Get-NodeId {
    foreach ($f in @((Join-Path $ClusterDir 'identity.json'), (Join-Path $AppDir 'node-id.json'))) {
        if (-not (Test-Path -LiteralPath $f)) { continue }
        $id = $null
        try { $id = (Get-Content -LiteralPath $f -Raw | ConvertFrom-Json).node_uuid } catch { $id = $null }
        if (-not ($id -is [string]) -or $id -notmatch $UuidPattern) {
            Die "$f names no node_uuid that is a UUID (the daemon refuses to start on it too)"
        }
        return $id
    }
    $f = Join-Path $AppDir 'node-id'
    if (Test-Path -LiteralPath $f) {
        $id = (Get-Content -LiteralPath $f -Raw).Trim()
        if ($id -notmatch $UuidPattern) { Die "$f is not a UUID" }
        return $id
    }
    Die "no node id yet: neither $ClusterDir\identity.json nor $AppDir\node-id.json exists (the daemon writes node-id.json when it starts)"
}

# Get-IngressAddr returns the ingress address workload-ingress.json names.
function Get-IngressAddr {
    $f = Join-Path $AppDir 'workload-ingress.json'
    if (-not (Test-Path -LiteralPath $f)) {
        Die "$f does not exist: the ingress is off (install writes it; or write {`"listen`": `"$ListenDefault`"} there and restart the worker)"
    }
    $a = $null
    try { $a = (Get-Content -LiteralPath $f -Raw | ConvertFrom-Json).listen } catch { $a = $null }
    if (-not ($a -is [string]) -or -not $a) { Die "$f names no listen address" }
    return $a
}

# Set-IngressFile writes workload-ingress.json when it is missing, so the new
# worker's first start serves the ingress the check posts to. It is written
# without a byte order mark, which a JSON reader need not accept.
function Set-IngressFile {
    $f = Join-Path $AppDir 'workload-ingress.json'
    if (Test-Path -LiteralPath $f) {
        if ($Listen) { Say "keeping the existing $f ($(Get-IngressAddr)); -Listen is used only when it is missing" }
        return
    }
    $addr = if ($Listen) { $Listen } else { $ListenDefault }
    $tmp = "$f.tmp.$PID"
    [IO.File]::WriteAllText($tmp, "{`"listen`": `"$addr`"}`n", (New-Object Text.UTF8Encoding($false)))
    Move-Item -LiteralPath $tmp -Destination $f -Force
    Say "wrote ${f}: the ingress listens on $addr"
}

function Get-EpochMs { return [DateTimeOffset]::UtcNow.ToUnixTimeMilliseconds() }

# New-Frame returns a check job's frame (times in epoch ms; a running job
# has no completedAt).
function New-Frame([string]$Method, [string]$State, [int]$Seq, [string]$Job, [string]$Node, [long]$Started, $Completed) {
    $info = [ordered]@{
        id = $Job; runId = $Job; model = 'install-check'; engine = 'install-check'; state = $State
        originatedFrom = $Node; scheduledOn = $null; seq = $Seq; createdAt = $Started; startedAt = $Started
        completedAt = $Completed; error = $null; requesterId = 'install-check'
    }
    $frame = [ordered]@{ jsonrpc = '2.0'; method = $Method; params = [ordered]@{ workloadInfo = $info } }
    return ($frame | ConvertTo-Json -Depth 5 -Compress)
}

# Send-Frame posts one frame; a non-2xx answer throws (like curl -f), and the
# daemon's one-line reason is shown.
function Send-Frame([string]$Url, [string]$Body) {
    try {
        $null = Invoke-WebRequest -UseBasicParsing -Method Post -Uri $Url -ContentType 'application/json' -Body ([Text.Encoding]::UTF8.GetBytes($Body)) -TimeoutSec 10
        return $true
    } catch {
        $reason = $_.Exception.Message
        if ($_.ErrorDetails -and $_.ErrorDetails.Message) { $reason = "$reason $($_.ErrorDetails.Message)" }
        [Console]::Error.WriteLine("${Prog}: the ingress refused the check: $reason")
        return $false
    }
}

function Get-ReadBack([string]$Url) {
    return Invoke-WebRequest -UseBasicParsing -Uri $Url -Headers @{ 'Workload-Read-Back' = '1' } -TimeoutSec 10
}

# Invoke-Check posts a check job through the ingress, naming this node's id
# as the daemon reads it, reads it back, and closes it. It waits up to the
# timeout for the ingress to answer first (the worker may just have started).
function Invoke-Check {
    $node = Get-NodeId
    $addr = Get-IngressAddr
    $base = "http://$addr"
    $end = (Get-Date).AddSeconds($Timeout)
    while ($true) {
        try { $null = Get-ReadBack "$base/v1/workloads?requesterId=install-check&limit=1"; break } catch { }
        if ((Get-Date) -gt $end) {
            [Console]::Error.WriteLine("${Prog}: the ingress at $addr did not answer within $Timeout s")
            return $false
        }
        Start-Sleep -Milliseconds 200
    }
    $started = Get-EpochMs
    $job = "install-check-$([DateTimeOffset]::UtcNow.ToUnixTimeSeconds())-$PID"
    if (-not (Send-Frame "$base/v1/workloads/events" (New-Frame 'workload:started' 'running' 1 $job $node $started $null))) { return $false }
    try {
        $shown = (Get-ReadBack "$base/v1/workloads?requesterId=install-check&limit=10000").Content
    } catch {
        [Console]::Error.WriteLine("${Prog}: the read-back failed: $($_.Exception.Message)")
        return $false
    }
    if (-not $shown.Contains("`"$job`"")) {
        [Console]::Error.WriteLine("${Prog}: the node does not show the check job ${job}: $shown")
        return $false
    }
    if (-not (Send-Frame "$base/v1/workloads/events" (New-Frame 'workload:completed' 'completed' 2 $job $node $started (Get-EpochMs)))) { return $false }
    Say "check passed: node $node took job $job through $addr and closed it"
    return $true
}

# Set-Executable puts From in Exe's place while Exe may be running: the
# running one is renamed aside (Windows allows that, not overwriting it).
function Set-Executable([string]$From, [string]$Exe) {
    $next = "$Exe.next.$PID"
    Copy-Item -LiteralPath $From -Destination $next -Force
    $aside = "$Exe.replaced"
    if (Test-Path -LiteralPath $aside) { Remove-Item -LiteralPath $aside -Force -ErrorAction SilentlyContinue }
    if (Test-Path -LiteralPath $aside) { $aside = "$Exe.replaced.$PID" }
    Move-Item -LiteralPath $Exe -Destination $aside -Force
    Move-Item -LiteralPath $next -Destination $Exe -Force
    return $aside
}

# Restore-Stock puts the stock executable back and restarts the worker on it.
function Restore-Stock([string]$Exe) {
    if (-not (Test-Path -LiteralPath "$Exe.stock")) { Die "no stock executable at $Exe.stock to roll back to" }
    $aside = Set-Executable "$Exe.stock" $Exe
    $id = Get-WorkerId -Quiet
    $old = 0
    if ($id) { Stop-Worker $id; $old = $id }
    Remove-Item -LiteralPath $aside -Force -ErrorAction SilentlyContinue
    $new = Wait-Restarted $old $Exe
    if (-not $new) { Die "rolled back $Exe, but the broker started no worker from it within $Timeout s" }
    Say "rolled back: the broker runs the stock executable $Exe again (pid $new)"
}

# Get-StockExe returns the executable to roll back: the running worker's
# when a stock copy sits beside it, else the one the last install recorded.
function Get-StockExe {
    $id = Get-WorkerId -Quiet
    if ($id) {
        $exe = Get-ExeOf $id
        if ($exe -and (Test-Path -LiteralPath "$exe.stock")) { return $exe }
    }
    if (-not (Test-Path -LiteralPath $Record)) {
        Die "no stock executable recorded in $Record and none beside the running worker (was this node installed with this script?)"
    }
    return (Get-Content -LiteralPath $Record -Raw).Trim()
}

switch ($Command) {
    'install' {
        if (-not $NewExecutable) { Die 'install needs the new executable: install.ps1 install NEW.exe' }
        if (-not (Test-Path -LiteralPath $NewExecutable -PathType Leaf)) { Die "${NewExecutable}: no such file" }
        $NewExecutable = (Resolve-Path -LiteralPath $NewExecutable).Path
        try { $ver = (& $NewExecutable --version 2>&1 | Out-String).Trim() } catch { Die "$NewExecutable does not run on this machine: $($_.Exception.Message)" }
        if ($LASTEXITCODE -ne 0) { Die "$NewExecutable does not run on this machine: $ver" }
        $id = Get-WorkerId
        if (-not $id) { Die "no running worker with --cluster-dir $ClusterDir (is PAIR running?)" }
        $exe = Get-ExeOf $id
        if (-not $exe -or -not (Test-Path -LiteralPath $exe -PathType Leaf)) { Die "cannot resolve the executable of worker $id" }
        Say "worker $id runs $exe"
        [IO.File]::WriteAllText($Record, "$exe`n", (New-Object Text.UTF8Encoding($false)))
        if (Test-Path -LiteralPath "$exe.stock") {
            Say "keeping the stock executable already saved at $exe.stock"
        } else {
            Copy-Item -LiteralPath $exe -Destination "$exe.stock.tmp.$PID"
            Move-Item -LiteralPath "$exe.stock.tmp.$PID" -Destination "$exe.stock"
            Say "saved the stock executable as $exe.stock"
        }
        Set-IngressFile
        $aside = Set-Executable $NewExecutable $exe
        Say "installed $ver as $exe; stopping worker $id so the broker starts it"
        Stop-Worker $id
        Remove-Item -LiteralPath $aside -Force -ErrorAction SilentlyContinue
        $new = Wait-Restarted $id $exe
        if ($new) {
            if (Invoke-Check) {
                Say "installed: worker $new runs $exe"
                exit 0
            }
        } else {
            [Console]::Error.WriteLine("${Prog}: the broker ran no worker from $exe within $Timeout s")
        }
        [Console]::Error.WriteLine("${Prog}: the new executable failed its check; rolling back to $exe.stock")
        Restore-Stock $exe
        exit 1
    }
    'check' {
        if (Invoke-Check) { exit 0 }
        exit 1
    }
    'rollback' {
        Restore-Stock (Get-StockExe)
        exit 0
    }
}
